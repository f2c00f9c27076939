"""Log source: tail vLLM / vllm-ascend logs (and custom hit/miss lines) and hand over complete lines.

Pipeline, one module per stage: ``tailer`` (follow files: rotation, truncation,
identity) -> ``framing`` (bytes -> complete lines, bounded) -> ``cachemon.normalise.log_stream``
(lines -> catalog series: vLLM's lines parsed by ``normalise.log_grammar``, user rules from ``rules``)
-> ``cachemon.runtime.logsource`` (store, state file via ``statefile``, self-metrics).
``config`` is the YAML section and flags; ``rule_spec`` a user rule as data.
"""
