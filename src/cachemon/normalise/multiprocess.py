"""Pages served by prometheus_client's multiprocess mode, and what cachemon does with them.

vLLM serves ``/metrics`` from ``prometheus_client.multiprocess.MultiProcessCollector`` when
it runs more than one API server process (``--api-server-count N``, also the default of some
data-parallel set-ups; ``vllm/v1/metrics/prometheus.py::setup_multiprocess_prometheus`` sets
``PROMETHEUS_MULTIPROC_DIR``); vllm-ascend runs the same code. What the page then looks like
(prometheus_client ``multiprocess.py``, ``MultiProcessCollector._accumulate_metrics``, v0.25.0):

* counters and histograms are summed over the processes' files, with **no ``_created``**
  samples, and a histogram's ``_sum``/``_count`` may come before its buckets;
* gauges depend on their ``multiprocess_mode``: ``all`` / ``liveall`` (the default) keep one
  series per process with a **``pid`` label**; ``min``/``max``/``sum``/``mostrecent`` and
  their ``live`` forms drop ``pid`` and reduce. vLLM sets ``mostrecent`` on most of its
  gauges (``vllm:num_requests_running``, ``vllm:cache_config_info``), not on all of them
  (``vllm:kv_cache_usage_perc`` has none at vLLM commit 005a810b, so it is per ``pid``);
  files of dead processes stay for non-``live`` modes until the directory is removed;
* the collector's registry holds nothing else: **no ``process_start_time_seconds``**.

cachemon needs no other parser for it: a counter without ``_created`` is reset-corrected
from its drops alone, a restart is told by the counters falling (vLLM starts a new
directory at every start), and per-process gauges collapse onto (model_name, engine) by
their maximum like every other collapsed series. ``per_process_gauges`` says which
stems came per process, for ``cachemon check`` and the docs.
"""
from __future__ import annotations

from dataclasses import dataclass

from cachemon.sources.exposition import Exposition

PID = "pid"


@dataclass(frozen=True)
class MultiprocessSigns:
    """What marks a page as a multiprocess-mode page."""

    per_process: tuple[str, ...] = ()     # stems with a pid label (gauges in mode all/liveall)
    pids: tuple[str, ...] = ()            # the pid values seen
    process_start_time: bool = True      # process_start_time_seconds on the page

    @property
    def multiprocess(self) -> bool:
        return bool(self.per_process)

    def describe(self) -> str:
        if not self.per_process:
            return ""
        missing = "" if self.process_start_time else (
            "; no process_start_time_seconds on the page, so a vLLM restart is told by its counters falling")
        return (f"prometheus_client multiprocess page ({len(self.pids)} API server process(es): "
                f"pid {', '.join(self.pids[:8])}{' ...' if len(self.pids) > 8 else ''}): per-process gauges "
                f"{', '.join(self.per_process)} are reduced to their maximum per model and engine{missing}")


def per_process_gauges(page: Exposition) -> MultiprocessSigns:
    """The stems whose samples carry a ``pid`` label, and the pids."""
    stems: list[str] = []
    pids: set[str] = set()
    for stem, rows in page.samples.items():
        got = {labels[PID] for labels, _ in rows if PID in labels}
        if got:
            stems.append(stem)
            pids |= got
    return MultiprocessSigns(tuple(sorted(stems)), tuple(sorted(pids, key=lambda p: (len(p), p))),
                             page.process_start_time is not None)
