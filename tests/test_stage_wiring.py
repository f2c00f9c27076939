"""Explicit stage wiring: the typed event log the stages share, the StageContext the
daemon hands each factory, warm-up as its own stage, the per-stage collect metrics, the
registry's refusal of duplicate families and the store's one read API.

Everything here is constructed (no vLLM): events, collectors and configs are made up in the
tests themselves; the upstream URLs point at a closed port and are never polled (no start()).
"""
from __future__ import annotations

import inspect

import pytest

from assert_support import nonempty
from cachemon import catalog as C
from cachemon.daemon import STAGES, Daemon
from cachemon.expose.render import Family
from cachemon.judge.attribute import Event
from cachemon.normalise.updates import CounterSample, SeriesKey, SourceId, Update
from cachemon.runconfig import from_dict
from cachemon.runtime.change_detector import ChangeDetector
from cachemon.runtime.component import Component, StagesCollector
from cachemon.runtime.warmup import WarmupTrigger
from cachemon.state.events import EventKind, EventLog
from cachemon.state.store import Store
from cachemon.web.workers import DuplicateFamilyError, Registry

CLOSED = "http://127.0.0.1:9/metrics"     # nothing listens: these daemons are never started


def _daemon(extra: dict | None = None) -> Daemon:
    return Daemon(from_dict({"upstreams": [{"name": "vllm", "url": CLOSED}],
                             "listen": {"address": "127.0.0.1", "port": 0}, **(extra or {})}))


# --- the event log -----------------------------------------------------------------------------

def test_event_log_delivers_to_subscribers_of_the_kind_and_keeps_the_newest_per_detail():
    log = EventLog(capacity=3)
    heard: list[tuple[str, str]] = []
    log.subscribe((EventKind.RESTART,), lambda e: heard.append((e.upstream, e.detail)))
    log.publish(EventKind.RESTART, "a", 1.0, "process_start_time changed")
    log.publish(EventKind.CHANGE, "a", 2.0, "model")
    log.publish(EventKind.CHANGE, "a", 3.0, "version")
    log.publish(EventKind.CHANGE, "a", 4.0, "model")
    log.publish(EventKind.CHANGE, "b", 5.0, "model")
    assert heard == [("a", "process_start_time changed")]          # only the kind subscribed to
    assert [e.seq for e in log.since(0)] == [3, 4, 5]                 # bounded: the oldest went
    assert [e.seq for e in log.since(4)] == [5]
    # latest survives the ring: one per (kind, detail), in first-seen order, newest time
    assert [(e.detail, e.at) for e in log.latest("a", (EventKind.CHANGE,))] == [("model", 4.0), ("version", 3.0)]
    assert [e.at for e in log.latest("a", (EventKind.RESTART,))] == [1.0]
    assert log.latest("c", tuple(EventKind)) == []


def test_a_failing_subscriber_neither_stops_the_publisher_nor_the_other_subscribers(caplog):
    log = EventLog()
    heard: list[int] = []

    def broken(_e: object) -> None:
        raise RuntimeError("constructed failure")
    log.subscribe((EventKind.RESTART,), broken)
    log.subscribe((EventKind.RESTART,), lambda e: heard.append(e.seq))
    ev = log.publish(EventKind.RESTART, "a", 1.0)
    assert heard == [ev.seq] and "event subscriber failed" in caplog.text


# --- the daemon's wiring -------------------------------------------------------------------------

def test_every_stage_factory_takes_the_typed_context_and_nothing_typed_any():
    names = [name for name, _ in STAGES]
    assert len(set(names)) == len(names) and "warmup" in names
    for name, factory in STAGES:
        sig = inspect.signature(factory)          # annotations are strings (postponed evaluation)
        assert [(p.name, p.annotation) for p in sig.parameters.values()] == [("ctx", "StageContext")], name
        assert "Any" not in str(sig.return_annotation) and "None" in str(sig.return_annotation), name


def test_a_stage_is_registered_once_in_one_place():
    from cachemon.runtime import stages
    assert STAGES is stages.STAGES and [n for n, _ in STAGES] == [
        "logs", "changes", "warmup", "cost", "kv_events", "routers", "attribution"]
    with pytest.raises(ValueError, match="registered twice"):
        stages.stage("cost")(stages.cost_stage)
    assert [n for n, _ in STAGES].count("cost") == 1


@pytest.mark.slow
def test_importing_the_daemon_loads_no_stage_module():
    import subprocess
    import sys
    code = ("import sys, cachemon.daemon; print(' '.join(sorted(m for m in sys.modules "
            "if m.startswith('cachemon.runtime.'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    for mod in nonempty(("logsource", "changes", "warmup", "cost", "kv_stage", "attribution_stage", "attribution")):
        assert f"cachemon.runtime.{mod}" not in loaded, loaded


def test_warmup_is_its_own_stage_and_hears_restarts_and_model_changes_on_the_log(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"model": "m", "prompt": "constructed"}\n')
    d = _daemon({"warmup": {"prompts": str(prompts)}})
    warm = [c for c in d.components if isinstance(c, WarmupTrigger)]
    det = [c for c in d.components if isinstance(c, ChangeDetector)]
    assert len(warm) == 1 and len(det) == 1 and all(isinstance(c, Component) for c in d.components)
    d.events.publish(EventKind.RESTART, "vllm", 10.0, "constructed")
    assert warm[0].pending == {"vllm": "restart"}
    warm[0].pending.clear()
    d.events.publish(EventKind.CHANGE, "vllm", 11.0, "version")        # not a trigger
    assert warm[0].pending == {}
    d.events.publish(EventKind.CHANGE, "vllm", 12.0, "model")
    assert warm[0].pending == {"vllm": "model_change"}
    assert det[0]._recheck.is_set()        # change detection re-checks models/version after the restart
    assert C.WARMUPS.name in d.registry.render().decode()


def test_without_warmup_config_there_is_no_warmup_stage():
    assert not [c for c in _daemon().components if isinstance(c, WarmupTrigger)]


def _copy(name: str, kind: str):
    from cachemon.judge.snapshots import UpstreamCopy
    return UpstreamCopy(name, kind, True, {}, {}, (), 0, None, None)


def test_the_snapshot_builder_reads_every_event_from_the_log():
    d = _daemon()
    stage = next(c for c in d.components if hasattr(c, "attributor"))
    builder = stage.attributor.builder
    assert builder.events is d.events
    d.events.publish(EventKind.CACHE_RESET, "vllm-log", 1.0, "vLLM log")   # backlog: before the first build
    builder.build({}, 2.0)
    up, log_up = _copy("vllm", "metrics"), _copy("vllm-log", "log")
    assert builder._events(up, ["vllm-log"]) == []
    d.events.publish(EventKind.CHANGE, "vllm", 5.0, "model")
    d.events.publish(EventKind.CACHE_RESET_SUSPECTED, "vllm", 6.0)
    d.events.publish(EventKind.CHANGE, "vllm", 7.0, "model")
    d.events.publish(EventKind.RESTART, "vllm", 8.0, "process_start_time changed")
    d.events.publish(EventKind.RESTART, "vllm", 8.5, "prefix_cache_queries_total went down")
    d.events.publish(EventKind.CACHE_RESET, "vllm-log", 10.0, "vLLM log")
    assert builder._events(up, ["vllm-log"]) == [
        Event(EventKind.CACHE_RESET, 10.0, "vLLM log"), Event(EventKind.RESTART, 8.5),
        Event(EventKind.CHANGE, 7.0, "model"), Event(EventKind.CACHE_RESET_SUSPECTED, 6.0)]
    assert builder._events(_copy("other", "metrics"), []) == []
    assert builder._events(log_up, []) == []          # a log's resets are its metrics upstream's (check judges logs)
    assert stage.attributor.ledger_view is None                      # no KV events followed: no ledger


def test_the_kv_ledger_is_built_once_on_first_ask():
    from cachemon.state.ledger.fleet import FleetLedger
    from test_kv_stream import Recorder
    cfg = {"upstreams": [{"name": "vllm", "url": CLOSED, "kv_events": "tcp://127.0.0.1:9"}],
           "listen": {"address": "127.0.0.1", "port": 0}}
    d = Daemon(from_dict(cfg))
    ledger = d.context.kv_ledger()
    assert isinstance(ledger, FleetLedger) and d.context.kv_ledger() is ledger
    kv = next(c for c in d.components if type(c).__name__ == "KvStage")
    att = next(c for c in d.components if hasattr(c, "attributor"))
    assert kv.sink is ledger and att.attributor.ledger_view == ledger.view   # one ledger, fed and read
    d2 = Daemon(from_dict(cfg), kv_sink_factory=lambda _s: Recorder())
    assert d2.context.kv_ledger() is None                             # another sink: nothing to read


# --- per-stage metrics and the registry ------------------------------------------------------------

class _Fixed:
    """A constructed collector: the named families, each with one sample."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def collect(self) -> list[Family]:
        out = []
        for n in self.names:
            f = Family(n, "gauge", "constructed")
            f.add("", 1.0)
            out.append(f)
        return out


class _Broken:
    def collect(self) -> list[Family]:
        raise RuntimeError("constructed failure")


def test_stage_metrics_say_which_stage_failed_and_the_others_are_still_exported(caplog):
    reg = Registry()
    reg.register(StagesCollector([("good", _Fixed("x_a")), ("bad", _Broken())]))
    page = reg.render().decode()
    assert "x_a 1" in page
    assert f'{C.STAGE_SUCCESS.name}{{stage="good"}} 1' in page
    assert f'{C.STAGE_SUCCESS.name}{{stage="bad"}} 0' in page
    assert f'{C.STAGE_DURATION.name}{{stage="bad"}} ' in page
    assert "stage bad: collecting its metrics failed" in caplog.text


def test_the_daemon_times_every_stage_it_runs():
    page = _daemon().registry.render().decode()
    for stage in ("store", "changes", "attribution"):
        assert f'{C.STAGE_SUCCESS.name}{{stage="{stage}"}} 1' in page, stage
    assert 'stage="cost"' not in page                                  # not configured: not there


def test_the_registry_refuses_a_family_name_registered_twice():
    reg = Registry()
    reg.register(_Fixed("x_a", "x_b"))
    with pytest.raises(DuplicateFamilyError, match="already registered by _Fixed: x_b"):
        reg.register(_Fixed("x_b", "x_c"))
    with pytest.raises(DuplicateFamilyError, match="more than once: x_d"):
        reg.register(_Fixed("x_d", "x_d"))
    reg.register(_Fixed("x_c"))                 # the refused ones left nothing behind
    assert reg.render().decode().count("# TYPE") == 3


def test_the_registry_uses_describe_when_a_collector_has_one():
    class Described(_Fixed):
        def describe(self) -> list[Family]:
            return [Family("x_late", "gauge", "constructed")]   # exported later, known now

    reg = Registry()
    reg.register(Described())
    with pytest.raises(DuplicateFamilyError):
        reg.register(_Fixed("x_late"))


# --- the store's read API -------------------------------------------------------------------------

def test_store_read_hands_out_read_only_views_of_the_same_state():
    store = Store({"1m": 60.0})
    key = SeriesKey(C.QUERY_TOKENS.name, ("m", "0", "local"))
    applied = store.apply("u", Update(counters=[CounterSample(key, SourceId(key.metric, (("model_name", "m"),)), 100.0)]), 1.0)
    assert applied == (None, False)
    with store.read() as view:
        assert view.windows == {"1m": 60.0}
        u = view.upstreams["u"]
        assert u.counters[key].value == 100.0 and u.scrapes == 1 and u.up
        assert u.local_totals() == (100.0, 0.0) and u.models() == ["m"]
        with pytest.raises(TypeError):
            view.upstreams["v"] = u     # type: ignore[index]
    assert store.record_error("u", "refused", "connection refused") is False     # it was up
    assert store.record_error("u", "refused", "connection refused") is True      # down already
    with store.read() as view:
        assert not view.upstreams["u"].up and view.upstreams["u"].errors["refused"] == 2
