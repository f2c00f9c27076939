"""The other offline commands: capture, report (cost), fingerprint, warmup."""
