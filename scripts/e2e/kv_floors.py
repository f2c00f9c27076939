"""kv_record.py scenarios for issue 35 (a moved match floor) and issue 38 item 3 (requests that skip the
prefix lookup). Registered into kv_record.SCENARIOS by kv_record.main(); both build on kv_recorder.py.

* ``block_size_restart``: the same 16 requests on ``--block-size 32``, a restart, then on ``--block-size
  128`` (the CPU default). Two shared system prompts: a short one whose shared head is 105 tokens (3 blocks
  of 32 hit; shorter than one block of 128) and a long one of 601 (18 blocks of 32 = 576, 4 of 128 = 512).
* ``prompt_logprobs_mixed``: requests with ``prompt_logprobs`` (chat and completions) and completions with
  ``echo`` + ``logprobs`` mixed with normal ones on shared prompts: vLLM skips the prefix lookup for them
  (``Request.skip_reading_prefix_cache``), recomputes the prompt and publishes its blocks again.
"""
from __future__ import annotations

import time

from kv_more import _send
from kv_recorder import SYSTEM_TEXT, Recorder, chat, tenant_system

SENTENCE = "You are the knowledge-base assistant of an online shop. Answer with the context the user gives. "
EXTRA = "Keep every answer short, polite and factual; cite the order number and the carrier when you know them. "
SHORT_SYSTEM = SENTENCE + EXTRA[:32]          # shared head 105 tokens (fixture tokenizer, chat template)
LONG_SYSTEM = SENTENCE * 8 + EXTRA[:80]       # shared head 601 tokens
FLOOR_POOLS = {32: 640, 128: 160}             # the same 20 480 tokens of KV pool at both block sizes


def _floor_bodies() -> list[tuple[str, dict]]:
    out = []
    for i in range(8):
        user = f"Question {i}: where is my parcel number {1000 + i}?"
        out.append(("short", chat(SHORT_SYSTEM, user)))
        out.append(("long", chat(LONG_SYSTEM, user)))
    return out


def _block_size(rec: Recorder, size: int) -> None:
    rec.plan["extra_args"] = ["--block-size", str(size)]
    rec.replicas["vllm"].pool = FLOOR_POOLS[size]


def floors_setup(rec: Recorder) -> None:
    _block_size(rec, 32)


def sc_block_size_restart(rec: Recorder, meta: dict) -> None:
    r = rec.replicas["vllm"]
    starts = [{"block_size": 32, "pool_blocks": FLOOR_POOLS[32]}]
    i = 0
    for size in (32, 128):
        if size != 32:
            time.sleep(2)
            r.stop()
            rec.write_event("restart", replica=r.name, block_size_before=32, block_size_after=size)
            _block_size(rec, size)
            r.start()
            starts.append({"block_size": size, "pool_blocks": FLOOR_POOLS[size]})
        rec.phase(f"block size {size}")
        for prompt, body in _floor_bodies():
            _send(rec, r, rec.args.scenario, i, body, prompt_name=prompt, block_size=size)
            i += 1
    meta["block_sizes"] = starts


def _completion(prompt: str, **extra) -> dict:
    return {"model": "tiny", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "prompt": prompt, **extra}


def sc_prompt_logprobs_mixed(rec: Recorder, _meta: dict) -> None:
    r = rec.replicas["vllm"]
    doc = SENTENCE * 10 + "Order 77 left the depot. "
    long_system = SYSTEM_TEXT + SYSTEM_TEXT
    plan: list[tuple[str, dict]] = [
        ("normal", chat(SYSTEM_TEXT, "Question 0: where is my parcel?")),
        ("normal", chat(SYSTEM_TEXT, "Question 1: where is my parcel?")),
        ("prompt_logprobs", chat(SYSTEM_TEXT, "Question 2: where is my parcel?", prompt_logprobs=1)),
        ("normal", chat(SYSTEM_TEXT, "Question 3: where is my parcel?")),
        ("prompt_logprobs", chat(SYSTEM_TEXT, "Question 4: where is my parcel?", prompt_logprobs=1)),
        ("normal", chat(tenant_system(1), "Question 5: where is my parcel?")),
        ("prompt_logprobs", chat(tenant_system(1), "Question 6: where is my parcel?", prompt_logprobs=1)),
        ("prompt_logprobs", chat(tenant_system(2), "Question 7: where is my parcel?", prompt_logprobs=1)),
        ("normal", chat(tenant_system(2), "Question 8: where is my parcel?")),
        ("normal", _completion(doc)),
        ("echo_logprobs", _completion(doc, echo=True, logprobs=1)),
        ("normal", _completion(doc)),
        ("prompt_logprobs", _completion(doc, prompt_logprobs=1)),
        ("prompt_logprobs", chat(long_system, "Question 13: where is my parcel?", prompt_logprobs=1)),
        ("normal", chat(long_system, "Question 14: where is my parcel?")),
        # a prompt of exactly one block, twice: the second recomputes its only block (a twin)
        ("normal", _completion_ids(128)),
        ("normal", _completion_ids(128)),
        ("prompt_logprobs", chat(SYSTEM_TEXT, "Question 17: where is my parcel?", prompt_logprobs=1)),
        ("normal", chat(SYSTEM_TEXT, "Question 18: where is my parcel?")),
    ]
    rec.phase("mixed")
    for i, (kind, body) in enumerate(plan):
        _send(rec, r, rec.args.scenario, i, body, kind=kind)


def _completion_ids(n: int) -> dict:
    return {"model": "tiny", "max_tokens": 1, "temperature": 0, "ignore_eos": True,
            "prompt": [(11 * k) % 600 + 30 for k in range(n)]}


FLOORS = {
    "block_size_restart": {"fn": sc_block_size_restart, "pool": FLOOR_POOLS[32], "setup": floors_setup,
                           "extra_args": ["--block-size", "32"]},
    "prompt_logprobs_mixed": {"fn": sc_prompt_logprobs_mixed, "pool": 160},
}
