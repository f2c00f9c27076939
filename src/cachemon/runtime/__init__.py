"""Runtime stages the sidecar runs: upstream polling, the log source, change detection, the
warm-up trigger and cost counters. They may import sources, normalise, state and expose, never
the offline tools (cachemon.diagnostics) or the command line."""
