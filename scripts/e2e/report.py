"""Named checks with PASS / FAIL / SKIP, and the final report (text + JSON). Never holds prompt text."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    at: float = field(default_factory=time.time)


class Report:
    def __init__(self, strict: bool = True):
        self.checks: list[Check] = []
        self.figures: dict[str, object] = {}
        self.phases: list[dict] = []
        self.strict = strict          # SKIP (a feature not present) counts as a failure
        self.started = time.time()
        self.error: str | None = None

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, PASS if ok else FAIL, detail))
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return ok

    def skip(self, name: str, why: str) -> None:
        self.checks.append(Check(name, SKIP, why))
        print(f"  [SKIP] {name}: {why}", flush=True)

    def fail(self, name: str, detail: str) -> None:
        self.check(name, False, detail)

    @property
    def ok(self) -> bool:
        bad = {FAIL, SKIP} if self.strict else {FAIL}
        return self.error is None and not any(c.status in bad for c in self.checks) and bool(self.checks)

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, SKIP: 0}
        for c in self.checks:
            out[c.status] += 1
        return out

    def render(self) -> str:
        elapsed = time.time() - self.started
        lines = ["", "=" * 78, "cachemon end-to-end report (real vLLM on CPU)", "=" * 78]
        for k, v in self.figures.items():
            lines.append(f"{k}: {v}")
        if self.phases:
            lines += ["", "traffic (sent one request at a time; cached = vLLM's usage.prompt_tokens_details.cached_tokens)"]
            hdr = ("phase", "requests", "prompt tok", "cached tok", "hit ratio", "seconds")
            rows = [hdr] + [(p["phase"], str(p["requests"]), str(p["prompt_tokens"]), str(p["cached_tokens"]),
                             f"{p['cached_tokens'] / p['prompt_tokens']:.1%}" if p["prompt_tokens"] else "-",
                             f"{p['seconds']:.1f}") for p in self.phases]
            w = [max(len(r[i]) for r in rows) for i in range(len(hdr))]
            for r in rows:
                lines.append("  " + "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
        lines += ["", "checks"]
        width = max((len(c.name) for c in self.checks), default=10)
        for c in self.checks:
            lines.append(f"  {c.status}  {c.name.ljust(width)}  {c.detail}")
        n = self.counts()
        lines.append("")
        if self.error:
            lines.append(f"ABORTED: {self.error}")
        verdict = "OK" if self.ok else "FAILED"
        lines.append(f"{verdict}: {n[PASS]} passed, {n[FAIL]} failed, {n[SKIP]} skipped"
                     f"{' (skips count as failures: --allow-missing to tolerate)' if n[SKIP] and self.strict else ''}; "
                     f"run time {elapsed / 60:.1f} min ({elapsed:.0f} s)")
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({
            "ok": self.ok, "error": self.error, "seconds": round(time.time() - self.started, 1),
            "figures": self.figures, "phases": self.phases, "checks": [asdict(c) for c in self.checks],
        }, indent=2, default=str) + "\n", encoding="utf-8")
