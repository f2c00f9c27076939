"""The runbook's "Why" part: what to do about each cause cachemon attributes (one section per cause, in the
report order)."""
from __future__ import annotations

from cachemon.judge import attribute as A

# What to do for each cause cachemon_cause_active names; alert descriptions link here
# ("#cause-<code>", GitHub's anchor for the heading "Cause `<code>`").
CAUSE_ACTIONS: dict[str, str] = {
    A.CauseCode.PREFIX_CACHING_DISABLED: "Start vLLM with `--enable-prefix-caching` (V0 and some V1 builds default to off).",
    A.CauseCode.COLD_CACHE: "A vLLM process's first traffic: nothing is cached yet, so the first request of every prefix "
                  "misses. Expected after a deploy or a scale-up; `cachemon warmup` replays the common prefixes "
                  "before users arrive. Never read as a dynamic prefix.",
    A.CauseCode.SHORT_PROMPTS: "Prompts no longer than the match floor (`cachemon_prefix_cache_match_floor_tokens`: one "
                     "KV block on plain models, 784-4096 tokens on hybrid Mamba models) cannot hit; on sliding-window "
                     "models a longer prefix also needs its window cached (see `sliding_window`). "
                     "Nothing to fix in the cache; a smaller `--block-size` (where the attention backend allows "
                     "it) or, on hybrid models, `--prefix-match-unit` lets shorter shared prefixes hit.",
    A.CauseCode.SLIDING_WINDOW: "The model has sliding-window layers (Gemma-2/3 style hybrids): a hit needs the "
                      "window before the match point in their KV-cache group, and vLLM keeps there only the "
                      "blocks before each prompt's end (and before a shared prefix seen once), so a prefix that "
                      "the full-attention layers hold may still miss. The KV events say so exactly "
                      "(`kv_cache_spec_sliding_window`); nothing is broken. The second request of a shared "
                      "prefix marks its end, so later ones hit; `cachemon analyze --model-config config.json` "
                      "predicts these hits per request.",
    A.CauseCode.CAPACITY: "Give vLLM more KV memory (`--gpu-memory-utilization`, `--kv-cache-memory-bytes`, smaller "
                "`--max-model-len`), run fewer concurrent sequences, or add a KV offload connector. "
                "`--kv-cache-metrics` makes evictions measured instead of inferred.",
    A.CauseCode.PREEMPTION_INFLATED: "The ratio is real tokens served from the cache, but part of it is the recompute of "
                           "preempted requests: fix the preemptions (see capacity), then read the ratio again.",
    A.CauseCode.PARALLEL_SAMPLING_INFLATED: "Requests with n > 1: vLLM runs each of the n sequences as a request of its "
                                  "own, so the prompt is counted n times and the copies hit the first one "
                                  "(vllm#56923). The ratio overstates reuse across requests: compare "
                                  "`cachemon_sampling_sequences_total` with `cachemon_sampling_requests_total`.",
    A.CauseCode.RESTART: "Expected after a restart: the cache starts empty. Run `cachemon warmup` or wait for traffic; "
               "if it does not recover, see CachemonHitRatioNotRecovered.",
    A.CauseCode.CACHE_RESET: "Someone called `POST /reset_prefix_cache` (vLLM logged it). Expected after weight updates "
                   "(RLHF) or benchmarks; the cache refills with traffic.",
    A.CauseCode.CACHE_RESET_SUSPECTED: "A reset inferred from the counters only (heuristic): check vLLM's log for "
                             "'Successfully reset prefix cache' and link the log to the upstream "
                             "(`logs.files[].upstream`) so cachemon reads it exactly.",
    A.CauseCode.CHANGE: "A model, vLLM version, tokenizer, chat template or cache config changed: old prefixes no "
              "longer match. Expected once; if the ratio stays low, diff the chat template.",
    A.CauseCode.MATCH_FLOOR_CHANGED: "The shortest prefix that can hit rose (`cachemon_prefix_cache_match_floor_tokens`, "
    "the block size on plain models): a restart with another `--block-size`, or an upgrade that moved the default "
    "(vLLM 0.34 on GPUs: 16 -> 64; the CPU backend and vllm-ascend use 128). A shared prefix shorter than the new "
    "floor never hits again and every hit is a multiple of it, so the ratio stays lower after the refill: waiting "
    "or `cachemon warmup` will not bring it back. Serve with the old `--block-size` where the attention backend "
    "takes it, or lengthen the shared prefixes (system prompt, tools) past the new floor; `cachemon analyze "
    "REQUESTS.jsonl --block-size OLD` and `--block-size NEW` side by side give the cost before you upgrade.",
    A.CauseCode.ROUTING_SKEW: "The router sends this replica traffic whose prefixes are cached elsewhere: route by "
                    "prefix or session affinity, or share the KV cache between replicas.",
    A.CauseCode.DYNAMIC_PREFIX_EXACT: "The KV-event ledger found a per-request value at the depth its message gives "
                            "(blocks x block size = token position): move it after the shared part of the "
                            "prompt. See CachemonDynamicPrefixFound.",
    A.CauseCode.DYNAMIC_PREFIX: "Something at the head of the prompt changes per request (timestamp, request id, "
                      "reordered tools). Run the `cachemon analyze` line from `cachemon check` on a sample "
                      "of requests to find the segment; put dynamic content last.",
    A.CauseCode.ROUTER_BLIND: "The router in front of this replica (`routers:`) made no prefix decision while the "
                    "engine hit: no prompt tokens to look up, or its KV index never matched, so the cache works "
                    "by luck. vllm-router on vLLM 0.32: start the workers with `--enable-scale-out` (else "
                    "`/v1/chat/completions/render` answers 403: `missing_tokens`). See CachemonRouterBlind.",
    A.CauseCode.ROUTER_STALE: "The router credited cached prefixes the engine no longer held (evicted before the "
                    "request arrived): its index lags the engine's evictions. Check its KV-event subscription "
                    "(lost or delayed events), give the engines more KV memory, or shorten the router's "
                    "approximate TTL where it guesses without events.",
    A.CauseCode.LOAD_OVER_LOCALITY: "The router chose a colder replica for balance (its decision says so); the "
                          "`routing_skew` tokens named beside it are what that cost. If the cost outweighs the "
                          "latency won, raise the router's balance thresholds (vllm-router "
                          "`--balance-abs-threshold`, `--balance-rel-threshold`) or add capacity.",
    A.CauseCode.REPLICA_LOAD_SKEW: "One replica took almost all of the model's traffic while the others idled. With "
                         "a cache-aware router on sequential traffic this is its tie-break (equal loads go to the "
                         "first worker): hits are high but nothing scales out. If the replicas should share the "
                         "load, check the router's policy (named beside it) and its load inputs (vllm-router "
                         "polls `GET /get_load`, which vLLM answers 404).",
}


def attribution_sections() -> str:
    parts = ["## Why: the causes cachemon attributes", "",
             ("`cachemon_cause_active{upstream, model_name, cause, certainty}` is 1 while a cause explains missed "
              "prompt tokens, whatever the ratio (the alerts gate on the thresholds), and "
              "`cachemon_cause_missed_tokens_total{upstream, model_name, cause, certainty}` counts the tokens it "
              "cost: exact from vLLM's KV-cache events where cachemon follows them (measured, a lower bound, "
              "after lost events), estimated from the counters otherwise. A cause becomes active after "
              "`attribution.hold` evaluations (at once when it cost a prompt's worth of tokens) and stays "
              "active `attribution.hold_down` after it last held; flapping inputs (KV usage, the ratio, the "
              "short-prompt share) enter and leave at different levels. `cachemon check` names the same causes "
              "(one engine, `src/cachemon/judge/attribute.py`)."), "",
             A.cause_table(), ""]
    for code in A.CAUSES:
        parts += [f"### Cause `{code}`", "", CAUSE_ACTIONS[code], ""]
    return "\n".join(parts)
