"""`cachemon check`'s terminal output: the report as lines, control characters escaped."""
from __future__ import annotations

from cachemon.check.report import CheckReport
from cachemon.urls import escape_controls


def render_text(report: CheckReport) -> str:
    lines: list[str] = []
    for s in report["sources"]:
        where = s.get("url") or s.get("path")
        lines.append(f"{s['kind']} source {s['name']} ({where}): {'up' if s['up'] else 'DOWN'}")
        if s["up"]:
            cc = s["cache_config"]
            lines.append(f"  era: {s['era']} ({s['era_versions']}), counters in {s['counter_unit']}"
                         + (f", vLLM {s['vllm_version']}" if s["vllm_version"] else ""))
            lines.append(f"  cache config: prefix caching {cc['prefix_caching'] or 'unknown'}, "
                         f"block size {cc['block_size'] or 'unknown'}, hash {cc['hash_algo'] or 'unknown'}")
            for r in s["series"]:
                ratio = r["hit_ratio_since_start"]
                lines.append(f"  {r['model_name'] or '?'} engine={r['engine'] or '-'} cache={r['cache']}: "
                             f"queries {r['query_tokens']:.0f} tokens, hits {r['hit_tokens'] or 0:.0f}, "
                             f"misses {r['miss_tokens'] or 0:.0f}, ratio since start "
                             f"{'n/a' if ratio is None else f'{ratio:.1%}'}")
                if r["interval"]:
                    w = r["interval"]
                    wr = w["hit_ratio"]
                    lines.append(f"    last {w['seconds']:g}s: {w['query_tokens']:.0f} query tokens, "
                                 f"{w['hit_tokens']:.0f} hits, ratio {'n/a (no traffic)' if wr is None else f'{wr:.1%}'}")
            for rr in s["reported_hit_ratios"]:
                lines.append(f"  reported hit ratio ({rr['basis']}, {rr['cache']}): {rr['value']:.1%}")
            for extra in s.get("text_extra", []):
                lines.append("  " + extra)
        for extra in s.get("kv_extra", []):
            lines.append("  " + extra)
        for f in s["findings"]:
            lines.append(f"  [{f['severity']}] {f['code']}: {f['message']}")
    lines.append(f"exit code {report['exit_code']}")
    # Upstream-provided text (model names, messages) may hold CR, LF or terminal escapes: one
    # report line stays one terminal line, and nothing reaches the terminal as a control.
    return "\n".join(escape_controls(line) for line in lines)
