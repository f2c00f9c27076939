"""Prometheus for the e2e harness: a test copy of cachemon's rules with short windows, config, API.

The shipped rules (``alerts/*.yml``, ``prometheus/*.yml``) are never edited: they are read,
rewritten into a temp dir and loaded from there. The rewrite (documented in docs/e2e.md):

- ``for:`` / ``keep_firing_for:`` durations are divided by ``FOR_SCALE`` (5m -> 10s), at least 5s;
- range selectors ``[d]`` / subqueries ``[d:r]`` and ``offset d`` in ``expr`` are divided by
  ``RANGE_SCALE`` (5m -> 20s), at least ``RANGE_FLOOR`` (10s = 10 scrapes at 1 s), at most ``RANGE_CAP``;
- group ``interval`` is dropped (the 1 s evaluation_interval applies).

Everything else (metric names, thresholds, label matchers, recorded-series names such as
``...:ratio_rate5m``) is kept, so the production logic is what gets tested.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import requests
import yaml

FOR_SCALE = 30
FOR_FLOOR = 5
RANGE_SCALE = 15
RANGE_FLOOR = 10
# Look-backs longer than any run (CachemonExporterAbsent's 1d) end at 4 minutes.
RANGE_CAP = 240

_DUR_PART = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(d: str) -> float:
    d = str(d).strip()
    parts = _DUR_PART.findall(d)
    if not parts or "".join(n + u for n, u in parts) != d:
        raise ValueError(f"not a Prometheus duration: {d!r}")
    return sum(int(n) * _UNIT[u] for n, u in parts)


def fmt(s: float) -> str:
    s = int(round(s))
    if s % 60 == 0 and s >= 60:
        return f"{s // 60}m"
    return f"{s}s"


def short_for(d: str) -> str:
    s = seconds(d)
    return "0s" if s == 0 else fmt(max(FOR_FLOOR, s / FOR_SCALE))


def short_range(d: str) -> str:
    return fmt(min(RANGE_CAP, max(RANGE_FLOOR, seconds(d) / RANGE_SCALE)))


_RANGE_RE = re.compile(r"\[(\s*[0-9a-z]+\s*)(?::(\s*[0-9a-z]*\s*))?\]")
_OFFSET_RE = re.compile(r"\boffset\s+(-?)([0-9][0-9a-z]*)")


def shorten_expr(expr: str) -> str:
    def rng(m):
        inner = short_range(m.group(1).strip())
        if m.group(2) is not None:
            step = m.group(2).strip()
            return f"[{inner}:{'1s' if step else ''}]"
        return f"[{inner}]"

    expr = _RANGE_RE.sub(rng, expr)
    return _OFFSET_RE.sub(lambda m: f"offset {m.group(1)}{short_range(m.group(2))}", expr)


def rewrite_rules(src_dirs: list[Path], out_dir: Path) -> dict:
    """Write test copies of every rule file found; returns {"files": [...], "alerts": {name: [severities]}, ...}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    info = {"files": [], "alerts": {}, "records": 0, "rewrites": []}
    for d in src_dirs:
        for path in sorted(list(d.glob("*.yml")) + list(d.glob("*.yaml"))):
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
                continue   # e.g. a scrape-config example, not a rule file
            for g in data["groups"]:
                g.pop("interval", None)
                for r in g.get("rules") or []:
                    if "for" in r:
                        new = short_for(r["for"])
                        info["rewrites"].append((r.get("alert") or r.get("record"), "for", r["for"], new))
                        r["for"] = new
                    if "keep_firing_for" in r:
                        r["keep_firing_for"] = short_for(r["keep_firing_for"])
                    r["expr"] = shorten_expr(str(r["expr"]))
                    if "alert" in r:
                        info["alerts"].setdefault(r["alert"], []).append((r.get("labels") or {}).get("severity", ""))
                    else:
                        info["records"] += 1
            target = out_dir / f"{d.name}--{path.name}"
            target.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            info["files"].append(target)
    return info


def write_config(path: Path, cachemon_target: str, rule_glob: str, vllm_target: str | None = None) -> None:
    """Jobs named as the shipped rules and dashboards expect (MonitoringConfig: job="cachemon", job="vllm")."""
    jobs = [{"job_name": "cachemon", "static_configs": [{"targets": [cachemon_target]}]}]
    if vllm_target:   # the dashboards' latency panels read vLLM's own histograms
        jobs.append({"job_name": "vllm", "static_configs": [{"targets": [vllm_target]}]})
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [rule_glob],
        "scrape_configs": jobs,
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")


class PromAPI:
    def __init__(self, base: str, timeout: float = 10.0):
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.s = requests.Session()

    def ready(self) -> bool:
        return self.s.get(self.base + "/-/ready", timeout=2).status_code == 200

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = self.s.get(self.base + "/api/v1/query", params=params, timeout=self.timeout)
        data = r.json()
        if data.get("status") != "success":
            raise RuntimeError(f"query failed: {data.get('errorType')}: {data.get('error')}")
        res = data["data"]
        if res["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": res["result"]}]
        return res["result"]

    def alerts(self) -> list[dict]:
        r = self.s.get(self.base + "/api/v1/alerts", timeout=self.timeout)
        return r.json()["data"]["alerts"]

    def firing(self, name: str, severity: str | None = None, state: str = "firing") -> list[dict]:
        return [a for a in self.alerts() if a["labels"].get("alertname") == name and a.get("state") == state
                and (severity is None or a["labels"].get("severity") == severity)]

    def rule_health(self) -> list[tuple[str, str, str]]:
        """(rule name, health, lastError) of every rule that is not healthy."""
        r = self.s.get(self.base + "/api/v1/rules", timeout=self.timeout).json()
        bad = []
        for g in r["data"]["groups"]:
            for rule in g["rules"]:
                if rule.get("health") not in ("ok", "unknown"):
                    bad.append((rule.get("name"), rule.get("health"), rule.get("lastError", "")))
        return bad

    def targets_up(self, job: str = "cachemon") -> bool:
        r = self.s.get(self.base + "/api/v1/targets", timeout=self.timeout).json()
        act = [t for t in r["data"]["activeTargets"] if t["labels"].get("job") == job]
        return bool(act) and all(t["health"] == "up" for t in act)


def wait_scrape_after(api: PromAPI, t: float, timeout: float = 15.0) -> None:
    """Wait until Prometheus has a cachemon sample newer than t and the rules were evaluated on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            res = api.query("timestamp(cachemon_build_info)")
            if res and float(res[0]["value"][1]) > t:
                time.sleep(1.5)   # one more evaluation of the rules
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus did not scrape cachemon within {timeout:g}s")
