"""cachemon: prefix-cache hit-rate monitoring for vLLM."""
__version__ = "0.1.0"
