"""Log source: tail vLLM / vllm-ascend logs (and custom hit/miss lines) into the unified metrics.

Pipeline, one module per stage: ``tailer`` (follow files: rotation, truncation,
identity) -> ``framing`` (bytes -> complete lines, bounded) -> ``vllm_lines`` and
``rules`` (parse) -> ``accumulate`` (counters, gauges, outcomes) -> ``source`` (store,
state file via ``statefile``, self-metrics). ``check`` is the one-shot
`cachemon check --log-file` view; ``config`` the YAML section and flags.
"""
