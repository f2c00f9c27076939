#!/usr/bin/env python3
"""The KV-event miss ledger and attribution v2, live on a REAL vLLM (CPU build), issue 16 item 9.

    PYTHONPATH=src .venv/bin/python scripts/e2e/kv_attribution.py [--only SCENARIO ...] \
        [--vllm-python /work/vllm/venv/bin/python] [--workdir .e2e/kv-attribution-...]

Not in CI (real servers: ~2 min per vLLM start on a CPU). For each scenario:

* real vLLM 0.32.0 server(s) with ``--kv-events-config`` (ZMQ PUB + replay ROUTER), started and
  recorded by scripts/e2e/kv_record.py's ``Recorder`` (its own SUB socket writes events.jsonl in
  parallel, plus requests.jsonl in ``cachemon analyze``'s format and vLLM's metrics);
* a fresh ``cachemon run --poll-interval 1s --kv-events NAME=tcp://...`` whose config file gives
  ``upstreams[].kv_events: {endpoint, replay, topic}`` (so gaps are recovered from the replay socket)
  and links the server's log;
* the scenario's traffic (kv_record's traffic functions);
* cachemon's /metrics read after every poll (a change of ``cachemon_upstream_scrapes_total``):
  ``cachemon_cause_active{cause,certainty}``, ``cachemon_kv_stored_tokens_total{reason}``,
  ``cachemon_kv_ledger_in_sync``, ``cachemon_cause_missed_tokens_total``.

Checks per scenario (report printed, and kv-attribution.json):
1. ledger == events: cachemon's final ``kv_stored_tokens_total`` by reason equals
   tests/kv_support.reference_split on the events our own SUB recorded (up to the same moment);
2. vLLM's counters: its prefix_cache_queries/hits equal the requests' usage sums (per process), and,
   for requests sent one at a time, the stored tokens equal sum(floor((P+C-1)/bs) - cached/bs) * bs;
3. analyze == events: ``cachemon analyze --format json`` (exact mode, the scenario's block and pool
   size) on requests.jsonl gives the same ``stored_split`` (per replica);
4. the confusion matrix: polls in which each cause was active, per scenario; the expected cause must
   be named, and no other cause but ``cold_cache`` (a fresh server's first traffic) may be active.

Only processes started here are stopped (SIGINT to their group, then SIGKILL).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import kv_record as K  # noqa: E402
import kv_recorder as R  # noqa: E402
import requests  # noqa: E402
from procs import free_port, wait_for  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kv_support import REASONS, load_messages, reference_split  # noqa: E402

BS = 128
COLD = "cold_cache"


def sc_dyn_head_then_tail(rec, meta: dict) -> None:
    """The per-request value at the head of the prompt, then at its end (the user's fix). The pause
    outlasts the attribution window (10 s) plus the hold-down (30 s), so the tail phase is judged on
    its own traffic: it must not name dynamic_prefix."""
    K.sc_dyn_head(rec, meta)
    rec.phase("pause")
    time.sleep(45)
    K.sc_dyn_tail(rec, meta)


# name -> kv_record plan (traffic, pool, replicas), the expected cause per upstream and phase, and the
# request index whose send time is the trigger (polls-to-name counts from there)
PLANS: dict[str, dict] = {
    "cold_start": {"fn": K.sc_cold_start, "pool": 160, "expect": {"vllm": "cold_cache"}, "trigger": 0},
    "tiny_pool": {"fn": K.sc_tiny_pool, "pool": 36, "expect": {"vllm": "capacity_eviction"}, "trigger": 6},
    "reset": {"fn": K.sc_reset, "pool": 160, "expect": {"vllm": "cache_reset"}, "trigger": 6},
    "dynamic_prefix_head": {"fn": K.sc_dyn_head, "pool": 160, "expect": {"vllm": "dynamic_prefix"}, "trigger": 1},
    # the value at the end of the prompt, on a fresh server (after the head phase on the same server, the
    # first tail request repeats one 128-token block seen under another parent: one more vote, named for
    # window + hold-down; sc_dyn_head_then_tail keeps that sequence for --only dynamic_prefix)
    "dynamic_prefix_tail": {"fn": K.sc_dyn_tail, "pool": 160, "expect": {"vllm": None}, "trigger": 0},
    "dynamic_prefix": {"fn": sc_dyn_head_then_tail, "pool": 160, "expect": {"vllm": "dynamic_prefix"},
                       "trigger": 1, "split_phase": "tail", "optional": True},
    "routing": {"fn": K.sc_routing, "pool": 160, "replicas": 2,
                "expect": {"replica1": "routing_skew", "replica0": None}, "trigger": 1},
    "bursts": {"fn": K.sc_bursts, "pool": 160, "expect": {"vllm": "cold_cache"}, "trigger": 0, "concurrent": True},
    "restart": {"fn": K.sc_restart, "pool": 160, "expect": {"vllm": "restart"}, "trigger": 6},
}


# ---------------------------------------------------------------------------- cachemon
def scrape(url: str) -> dict:
    text = requests.get(url, timeout=5).text
    out: dict = {"scrapes": {}, "active": [], "stored": {}, "in_sync": {}, "missed": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lab = s.labels
            if s.name == "cachemon_upstream_scrapes_total":
                out["scrapes"][lab["upstream"]] = s.value
            elif s.name == "cachemon_cause_active" and s.value == 1:
                out["active"].append([lab["upstream"], lab["cause"], lab.get("certainty", "")])
            elif s.name == "cachemon_kv_stored_tokens_total":
                out["stored"].setdefault(lab["upstream"], {})[lab["reason"]] = s.value
            elif s.name == "cachemon_kv_ledger_in_sync":
                out["in_sync"][lab["upstream"]] = s.value
            elif s.name == "cachemon_cause_missed_tokens_total":
                key = f'{lab["upstream"]}|{lab["cause"]}|{lab.get("certainty", "")}'
                out["missed"][key] = s.value
    return out


class Watch:
    """cachemon's /metrics after every poll: a sample whenever an upstream's scrape counter moved."""

    def __init__(self, url: str):
        self.url, self.samples, self.stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        last: dict = {}
        while not self.stop.is_set():
            try:
                s = scrape(self.url)
                moved = sorted(u for u, v in s["scrapes"].items() if last.get(u) != v)
                if moved:
                    s["t"], s["polled"] = time.time(), moved
                    self.samples.append(s)
                    last = dict(s["scrapes"])
            except (requests.RequestException, ValueError, KeyError):
                pass
            self.stop.wait(0.25)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def start_cachemon(rec, work: Path, name: str):
    port = free_port()
    ups = []
    logs = []
    for r in rec.replicas.values():
        ups.append({"name": r.name, "url": r.api + "/metrics",
                    "kv_events": {"endpoint": f"tcp://127.0.0.1:{r.ev_port}",
                                  "replay": f"tcp://127.0.0.1:{r.replay_port}", "topic": R.TOPIC}})
        logs.append({"path": str(r.log), "name": f"{r.name}-log", "upstream": r.name})
    # the ledger's counts at once (new_series_hold 0): the checks below compare them with the events as they end
    cfg = {"upstreams": ups, "attribution": {"window": "10s", "lookback": "5m"}, "events": {"interval": "5s"},
           "kv_events": {"new_series_hold": "0s"},
           "logs": {"files": logs, "from_beginning": False, "state_file": "none", "poll_interval": "250ms"}}
    cfg_path = work / f"cachemon-{name}.yaml"
    cfg_path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    argv = [sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{port}", "--poll-interval", "1s",
            "--window", "10s", "--window", "1m", "--config", str(cfg_path)]
    for r in rec.replicas.values():      # the flag form too: it replaces only the endpoint, the replay stays
        argv += ["--kv-events", f"{r.name}=tcp://127.0.0.1:{r.ev_port}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    p = rec.procs.start(f"cachemon-{name}", argv, work / f"cachemon-{name}.log", env=env, cwd=work)
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: "cachemon_upstream_up" in requests.get(url, timeout=2).text, 60, 0.3, "cachemon serving",
             alive=p.alive)
    return p, url


# ---------------------------------------------------------------------------- checks
def usage_lines(out: Path) -> list[dict]:
    return [d for d in (json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines() if x.strip())
            if "usage" in d]


def vllm_counter_check(out: Path, meta: dict, sequential: bool, ref: dict) -> dict:
    """vLLM's own counters against the requests' usage (the last process of each replica) and, one
    request at a time, the stored tokens per request against the events' total."""
    res: dict = {}
    lines = usage_lines(out)
    for name, rep in meta["replicas"].items():
        since = rep["starts"][-1]
        mine = [d for d in lines if d["replica"] == name and d["t_send"] >= since]
        q = sum(d["usage"]["prompt_tokens"] for d in mine)
        h = sum((d["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for d in mine)
        fc = meta["final_counters"].get(name, {})
        r = {"queries_vllm": fc.get("vllm:prefix_cache_queries_total"), "queries_usage": q,
             "hits_vllm": fc.get("vllm:prefix_cache_hits_total"), "hits_usage": h}
        r["queries_hits_equal"] = r["queries_vllm"] == q and r["hits_vllm"] == h
        allmine = [d for d in lines if d["replica"] == name]
        stored = sum(((d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"] - 1) // BS
                      - ((d["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0) // BS) * BS
                     for d in allmine)
        r["stored_formula"] = stored
        r["stored_events"] = sum(ref.get(name, {}).values())
        r["stored_equal"] = stored == r["stored_events"] if sequential else None
        res[name] = r
    return res


def analyze_split(out: Path, pool: int, replicas: int, work: Path, name: str) -> dict:
    argv = [sys.executable, "-m", "cachemon.cli", "analyze", str(out / "requests.jsonl"), "--tokenizer",
            str(R.MODEL_SRC), "--block-size", str(BS), "--cache-blocks", str(pool), "--replicas", str(replicas),
            "--routing", "round-robin", "--no-curve", "--top", "0", "--format", "json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False)
    (work / f"analyze-{name}.json").write_text(r.stdout)
    if r.returncode not in (0, 3):
        return {"error": f"exit {r.returncode}: {r.stderr[-500:]}"}
    js = json.loads(r.stdout)
    sp = js["stored_split"]
    names = sorted({d["replica"] for d in usage_lines(out)})
    if replicas == 1:
        return {names[0]: sp["tokens"]}
    return dict(zip(names, sp["by_replica"], strict=True))


def norm(split: dict) -> dict:
    return {r: int(split.get(r, 0)) for r in REASONS}


# ---------------------------------------------------------------------------- one scenario
def run_scenario(name: str, args, work: Path) -> dict:
    plan = PLANS[name]
    out = work / name
    rargs = SimpleNamespace(scenario=name, out=str(out), vllm_python=args.vllm_python,
                            start_timeout=args.start_timeout, gap=1.0, old_release=args.old_release)
    print(f"scenario {name}", flush=True)
    rec = R.Recorder(rargs, plan)
    meta: dict = {}
    names = ["replica0", "replica1"] if plan.get("replicas", 1) == 2 else ["vllm"]
    for n in names:
        rec.add_replica(n, plan["pool"])
    rec.start_loops()
    time.sleep(0.5)
    watch = None
    t_final = None
    final: dict = {}
    try:
        ths = [threading.Thread(target=r.start, daemon=True) for r in rec.replicas.values()]   # side by side
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        if not all(r.up for r in rec.replicas.values()):
            raise RuntimeError("a vLLM server did not come up")
        first = next(iter(rec.replicas.values()))
        rec.version = first.session.get(first.api + "/version", timeout=5).json().get("version", "")
        cm, url = start_cachemon(rec, work, name)
        watch = Watch(url)
        time.sleep(3)                           # a few idle polls before the traffic
        rec.phase("traffic start")
        plan["fn"](rec, meta)
        rec.phase("traffic end")
        time.sleep(args.linger)
        t_final = time.time()
        final = scrape(url)
        watch.close()
        rec.finish(meta)                        # stops vLLM, writes metadata
        rec.procs.stop(cm)
    finally:
        if watch is not None:
            watch.close()
        rec.procs.stop_all()
        rec.stop_flag.set()
    samples = watch.samples if watch else []
    (out / "cachemon-polls.json").write_text(json.dumps({"samples": samples, "final": final, "t_final": t_final,
                                                         "phases": rec.phases}, default=str))
    return evaluate(name, work)


def one_per_poll(samples: list, up: str, interval: float = 1.0) -> list:
    """cachemon's scrape counter can move more than once per poll interval (extra reads of the
    upstream); one sample per upstream per ``interval`` (the latest of each), so a count is in polls."""
    out: list = []
    for s in samples:
        if up not in s["polled"]:
            continue
        if out and s["t"] - out[-1]["t"] < 0.9 * interval:
            out[-1] = s
        else:
            out.append(s)
    return out


def evaluate(name: str, work: Path) -> dict:
    """The checks, from what the scenario left on disk (so a run can be re-evaluated: --evaluate)."""
    plan = PLANS[name]
    out = work / name
    saved = json.loads((out / "cachemon-polls.json").read_text())
    meta = json.loads((out / "metadata.json").read_text())
    samples, final, t_final, phases = saved["samples"], saved["final"], saved["t_final"], saved["phases"]
    replicas = list(meta["replicas"])
    msgs = [m for m in load_messages(out) if m.t <= t_final]
    ref = {k: norm(v) for k, v in reference_split(msgs).items()}
    ledger = {u: norm(v) for u, v in final.get("stored", {}).items()}
    sequential = not plan.get("concurrent")
    res: dict = {"scenario": name, "vllm_version": meta.get("vllm_version"), "messages": len(msgs),
                 "events_split": ref, "ledger_split": ledger, "ledger_equals_events": ledger == ref,
                 "in_sync_min": {u: min((s["in_sync"][u] for s in samples if u in s["in_sync"]), default=None)
                                 for u in replicas},
                 "missed_tokens_final": final.get("missed", {}), "polls": len(samples)}
    res["vllm_counters"] = vllm_counter_check(out, meta, sequential, ref)
    try:
        an = {k: norm(v) for k, v in analyze_split(out, plan["pool"], len(replicas), work, name).items()}
    except Exception as e:  # reported, not fatal
        an = {"error": repr(e)}
    res["analyze_split"] = an
    res["analyze_equals_events"] = an == ref
    # --- the matrix: per upstream (and, for the dynamic prefix, per phase), polls per active cause
    lines = usage_lines(out)
    trig_i = plan["trigger"]
    split_t = None
    if plan.get("split_phase"):
        split_t = next(p["t"] for p in phases if p["phase"] == plan["split_phase"])
    cols: dict = {}
    for up, expect in plan["expect"].items():
        mine = [d for d in lines if d["replica"] == up]
        trig = mine[trig_i]["t_send"] if len(mine) > trig_i else (mine[0]["t_send"] if mine else 0)
        parts = [(f"{name}/{up}" if len(plan["expect"]) > 1 else name, expect, 0.0, split_t or 1e18)]
        if split_t:
            parts = [(f"{name}_head", expect, 0.0, split_t), (f"{name}_tail", None, split_t, 1e18)]
        for col, exp, lo, hi in parts:
            polls = [s for s in one_per_poll(samples, up) if lo <= s["t"] < hi]
            counts: dict = {}
            cert: dict = {}
            for s in polls:
                for u, c, ce in s["active"]:
                    if u == up:
                        counts[c] = counts.get(c, 0) + 1
                        cert.setdefault(c, set()).add(ce)
            t0 = max(trig, lo)
            after = [s for s in polls if s["t"] >= t0]
            named = None
            if exp:
                named = next((k for k, s in enumerate(after, 1)
                              if any(u == up and c == exp for u, c, _ in s["active"])), None)
            wrong = sorted(set(counts) - {exp, COLD})
            cols[col] = {"upstream": up, "expect": exp, "polls": len(polls), "counts": counts,
                         "certainty": {c: sorted(v) for c, v in cert.items()}, "polls_to_name": named,
                         "wrong": wrong, "ok": (exp is None or named is not None) and not wrong}
    res["matrix"] = cols
    vc = res["vllm_counters"]
    res["ok"] = (res["ledger_equals_events"] and all(c["ok"] for c in cols.values())
                 and all(r["queries_hits_equal"] for r in vc.values())
                 and all(r["stored_equal"] is not False for r in vc.values())
                 and (res["analyze_equals_events"] or not sequential))
    return res


def report(results: list[dict]) -> str:
    cols = [(c, m) for r in results for c, m in r.get("matrix", {}).items()]
    causes = sorted({c for _, m in cols for c in m["counts"]} | {m["expect"] for _, m in cols if m["expect"]})
    out = ["| cause \\ scenario | " + " | ".join(c for c, _ in cols) + " |", "|---|" + "---|" * len(cols)]
    for cause in causes:
        cells = []
        for _, m in cols:
            n = m["counts"].get(cause, 0)
            cells.append(f"**{n}**" if cause == m["expect"] else str(n))
        out.append(f"| {cause} | " + " | ".join(cells) + " |")
    out.append("| polls (1 s) | " + " | ".join(str(m["polls"]) for _, m in cols) + " |")
    out.append("| certainty of the expected cause | " + " | ".join(
        ", ".join(m["certainty"].get(m["expect"], [])) or "-" for _, m in cols) + " |")
    out.append("| polls to name | " + " | ".join(str(m["polls_to_name"]) if m["expect"] else "-" for _, m in cols)
               + " |")
    out.append("| wrong causes | " + " | ".join(", ".join(m["wrong"]) or "none" for _, m in cols) + " |")
    out.append("")
    out.append("| scenario | ledger = events | analyze = events | vLLM queries/hits = usage | stored = formula "
               "| events split (tokens) |")
    out.append("|---|---|---|---|---|---|")
    for r in results:
        if "matrix" not in r:
            out.append(f"| {r['scenario']} | ERROR {r.get('error')} | | | | |")
            continue
        vc = r["vllm_counters"]
        sp = "; ".join(f"{u}: " + ", ".join(f"{k} {v}" for k, v in s.items() if v) for u, s in r["events_split"].items())
        st = ", ".join("n/a (concurrent)" if v["stored_equal"] is None else
                       f"{v['stored_formula']} = {v['stored_events']}" if v["stored_equal"] else
                       f"{v['stored_formula']} != {v['stored_events']}" for v in vc.values())
        qh = ", ".join(f"{v['queries_vllm']:.0f}/{v['hits_vllm']:.0f} vs {v['queries_usage']}/{v['hits_usage']}"
                       + ("" if v["queries_hits_equal"] else " DIFFER") for v in vc.values())
        out.append(f"| {r['scenario']} | {'yes' if r['ledger_equals_events'] else 'NO ' + json.dumps(r['ledger_split'])}"
                   f" | {'yes' if r['analyze_equals_events'] else 'NO ' + json.dumps(r['analyze_split'])} | {qh} | {st} | {sp} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default="/work/vllm/venv/bin/python")
    ap.add_argument("--workdir", default=str(ROOT / ".e2e" / time.strftime("kv-attribution-%Y%m%d-%H%M%S")))
    ap.add_argument("--only", nargs="*", default=[], choices=sorted(PLANS))
    ap.add_argument("--start-timeout", type=float, default=400.0)
    ap.add_argument("--old-release", action="store_true",
                    help="an old vLLM (0.10.x/0.11.x, venv from old_release_venv.sh): tokenizer config for transformers 4")
    ap.add_argument("--evaluate", action="store_true", help="only re-run the checks on --workdir's recordings")
    ap.add_argument("--linger", type=float, default=8.0, help="seconds of polls after the traffic")
    args = ap.parse_args()

    def _bye(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _bye)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results: list[dict] = []
    names = args.only or [n for n, p in PLANS.items() if not p.get("optional")]
    if args.evaluate:
        names = [n for n in names if (work / n / "cachemon-polls.json").is_file()]
    for name in names:
        ts = time.time()
        try:
            r = evaluate(name, work) if args.evaluate else run_scenario(name, args, work)
        except Exception as e:  # one broken scenario must not hide the others
            print(f"  ERROR {name}: {type(e).__name__}: {e}", flush=True)
            r = {"scenario": name, "ok": False, "error": f"{type(e).__name__}: {e}"}
        r["seconds"] = round(time.time() - ts)
        results.append(r)
        print(f"  {'PASS' if r['ok'] else 'FAIL'} {name} ({r['seconds']} s): "
              + json.dumps({k: r.get(k) for k in ("ledger_equals_events", "analyze_equals_events", "matrix")},
                           default=str), flush=True)
        (work / "kv-attribution.json").write_text(json.dumps(
            {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "results": results,
             "seconds": round(time.time() - t0)}, indent=1, default=str))
    text = report(results)
    print(text)
    print(f"{sum(bool(r['ok']) for r in results)}/{len(results)} scenarios passed in {time.time() - t0:.0f}s")
    (work / "report.md").write_text(text + "\n")
    return 0 if results and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
