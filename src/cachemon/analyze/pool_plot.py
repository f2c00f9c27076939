"""`cachemon analyze --plot FILE`: the pool-size curve (pool_curve.py) as a picture, the current pool marked.

matplotlib is an optional extra (`pip install 'cachemon[plot]'`): imported here only, when a plot is asked
for, so the sidecar (`cachemon run`) never loads it (tests/test_analyze_plot.py checks both)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cachemon.analyze.chat_template import MissingExtraError

if TYPE_CHECKING:
    from cachemon.analyze.results import AnalyzeResult

FORMATS = (".png", ".svg")
PLOT_HINT = "install the plot extra: pip install 'cachemon[plot]'"


class PlotError(Exception):
    """The plot cannot be drawn (no curve, a file name without .png/.svg, an unwritable path)."""


def plot_pool_curve(res: AnalyzeResult, path: str) -> None:
    """Draw hit ratio against KV pool size (blocks, vLLM's null block included) to `path` (.png or .svg)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise PlotError(f"--plot {path}: give a .png or .svg file name")
    if not res.curve or not res.total_prompt:
        raise PlotError("--plot: no pool-size curve to draw (--no-curve, a sliding-window model, "
                                "or no request was simulated)")
    try:
        import matplotlib
        matplotlib.use("Agg")      # no display: draw to the file only
        matplotlib.rcParams["svg.fonttype"] = "none"     # SVG text stays text (searchable, smaller)
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingExtraError(f"--plot needs matplotlib; {PLOT_HINT}") from e
    p = res.total_prompt
    points = res.curve_points()
    end = len(res.curve) - 1
    # a step curve: the hit ratio holds from each change to the next; extend to a margin past the knee
    knee = res.pool_for(1.0) or end
    right = max(knee, res.cache_blocks or 0) * 1.3 + 2
    xs = [c for c, _ in points] + [right]
    ys = [100 * t / p for _, t in points] + [100 * points[-1][1] / p]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.step(xs, ys, where="post", color="#1f77b4", linewidth=2, label="predicted hit ratio")
    full = 100 * res.curve[-1] / p
    ax.axhline(full, color="#7f7f7f", linestyle=":", linewidth=1, label=f"unlimited pool: {full:.1f} %")
    for frac, colour in ((0.9, "#2ca02c"),):
        need = res.pool_for(frac)
        if need is not None and res.curve[-1]:
            ax.axvline(need, color=colour, linestyle="--", linewidth=1,
                       label=f"{int(frac * 100)} % of unlimited: {need:,} blocks")
    if res.cache_blocks:
        now = 100 * res.curve[min(res.cache_blocks, end)] / p
        ax.axvline(res.cache_blocks, color="#d62728", linewidth=1.5,
                   label=f"current pool: {res.cache_blocks:,} blocks -> {now:.1f} %")
        ax.plot([res.cache_blocks], [now], "o", color="#d62728")
    ax.set_xlim(0, right)
    ax.set_ylim(0, max(5.0, full * 1.1))
    ax.set_xlabel(f"KV pool size (blocks of {res.block_size} tokens, vLLM's num_gpu_blocks)")
    ax.set_ylabel("prefix-cache hit ratio (%)")
    ax.set_title(f"Hit ratio against KV pool size: {res.requests:,} requests, {p:,} prompt tokens")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format=ext[1:])
    except OSError as e:
        raise PlotError(f"--plot {path}: cannot write ({e.strerror or e})") from None
    finally:
        plt.close(fig)
