"""Runtime stages the sidecar runs: upstream polling, the log source, the KV-event stage, change
detection, attribution, the warm-up trigger and cost counters. They may import web, judge, expose,
state, normalise and sources, never the offline tools (cachemon.analyze, cachemon.tools) or the
command line."""
