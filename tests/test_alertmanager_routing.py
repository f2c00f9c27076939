"""The shipped rules through a real Prometheus and a real Alertmanager with kube-prometheus-stack's
default inhibit rules: which alerts reach the receiver.

Five constructed cachemon targets, labelled as a PodMonitor scrape labels them (namespace, pod):

    ns-a/a-0  model m1  50 % hits   -> critical and warning; the warning is inhibited by the
                                       critical of its own namespace (the stack's intent)
    ns-a/a-1  model m2  90 % hits   -> nothing
    ns-b/b-0  model m2  70 % hits   -> warning, which must arrive
    ns-b/b-1  model m1  95 % hits   -> nothing
    ns-c/c-0  nothing listening     -> CachemonExporterDown (warning)

Before the fix the recording rules summed `by (job, instance, upstream, model_name)`: every
hit-ratio alert lost its namespace, so a-0's critical matched `equal: [namespace, alertname]`
for b-0's warning too and silenced it, and the per-model "fleet" spanned namespaces (a spurious
CachemonReplicaHitRatioSkew for a-0 against b-1). The "pre-fix" case rebuilds those rules and shows
exactly that, so this test fails if the shipped rules drop target labels again.

Prometheus evaluates the shipped groups (generate.rule_groups) with `for:` shortened to 1s,
1 s scrape and evaluation, on ephemeral ports; Alertmanager's config is
tests/fixtures/alertmanager/kube-prometheus-stack-defaults.yaml, checked by `amtool check-config`.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from cachemon import catalog as c
from cachemon.monitoring import generate, serialise
from cachemon.monitoring import site as mconfig
from helpers import FIXTURES, free_port
from test_monitoring_promtool import require_binary
from test_prometheus_integration import _stop, wait_for

pytestmark = pytest.mark.alertmanager

AM_CONFIG = FIXTURES / "alertmanager" / "kube-prometheus-stack-defaults.yaml"
QUERY_TOKENS_PER_SECOND = 1000.0   # far above the traffic floor
# (namespace, pod, model_name, hit ratio); None: a target nothing listens on.
TARGETS = [("ns-a", "a-0", "m1", 0.50), ("ns-a", "a-1", "m2", 0.90),
           ("ns-b", "b-0", "m2", 0.70), ("ns-b", "b-1", "m1", 0.95), ("ns-c", "c-0", None, None)]
LOW = "CachemonPrefixCacheHitRatioLow"
EXPECTED = {
    "shipped": {(LOW, "critical", "ns-a", "a-0", "m1"), (LOW, "warning", "ns-b", "b-0", "m2"),
                ("CachemonExporterDown", "warning", "ns-c", "c-0", None)},
    # namespace and pod gone from the hit-ratio alerts; b-0's warning silenced by a-0's critical;
    # m1's "fleet" spans both namespaces, so a-0 (50 %) counts as skewed against b-1 (95 %)
    "pre-fix": {(LOW, "critical", None, None, "m1"), ("CachemonExporterDown", "warning", "ns-c", "c-0", None),
                ("CachemonReplicaHitRatioSkew", "warning", None, None, "m1")},
}
SUPPRESSED = {
    "shipped": {(LOW, "warning", "ns-a", "a-0", "m1")},
    "pre-fix": {(LOW, "warning", None, None, "m1"), (LOW, "warning", None, None, "m2")},
}


def key(labels: dict) -> tuple:
    return (labels["alertname"], labels["severity"], labels.get("namespace"), labels.get("pod"),
            labels.get(c.MODEL))


class FakeCachemon:
    """A constructed cachemon /metrics page whose token counters grow at a fixed hit ratio."""

    def __init__(self, model: str, ratio: float):
        self.model, self.ratio, self.t0 = model, ratio, time.time()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = outer.page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self) -> str:
        queries = round((time.time() - self.t0) * QUERY_TOKENS_PER_SECOND)
        labels = f'upstream="vllm",{c.MODEL}="{self.model}",engine="0",cache="local"'
        return (f"# TYPE {c.QUERY_TOKENS.name} counter\n{c.QUERY_TOKENS.sample_name}{{{labels}}} {queries}\n"
                f"# TYPE {c.HIT_TOKENS.name} counter\n{c.HIT_TOKENS.sample_name}{{{labels}}} {round(queries * self.ratio)}\n"
                f"# TYPE {c.UPSTREAM_UP.name} gauge\n{c.UPSTREAM_UP.sample_name}{{upstream=\"vllm\"}} 1\n")


def pre_fix(groups: tuple[dict, dict]) -> list[dict]:
    """The rules as they were: replica sums `by (job, instance, upstream, model_name[, engine])`."""
    old = {"sum without (cache) (": "sum by (job, instance, upstream, model_name, engine) (",
           "sum without (engine, cache) (": "sum by (job, instance, upstream, model_name) ("}
    out = json.loads(json.dumps(list(groups)))
    for rule in out[0]["rules"]:
        for new_text, old_text in old.items():
            rule["expr"] = rule["expr"].replace(new_text, old_text)
    return out


class Webhook:
    def __init__(self):
        self.alerts: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.alerts += [a for a in payload["alerts"] if a["status"] == "firing"]
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self) -> set[tuple]:
        return {key(a["labels"]) for a in list(self.alerts)}


def start(cmd: list[str], log: Path, request) -> subprocess.Popen:
    out = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    request.addfinalizer(out.close)
    request.addfinalizer(lambda: _stop(proc))
    return proc


def test_amtool_accepts_the_stack_default_config():
    r = subprocess.run([require_binary("amtool", "prometheus-alertmanager"), "check-config", str(AM_CONFIG)],
                       check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 inhibit rules" in r.stdout


@pytest.mark.parametrize("rules_variant", ["shipped", "pre-fix"])
def test_alerts_reaching_the_receiver_under_the_stack_inhibit_rules(tmp_path, request, rules_variant):
    prometheus_bin = require_binary("prometheus")
    am_bin = require_binary("alertmanager", "prometheus-alertmanager", "prometheus-alertmanager")

    webhook = Webhook()
    request.addfinalizer(webhook.server.shutdown)
    am_cfg = yaml.safe_load(AM_CONFIG.read_text())
    am_cfg["receivers"][1]["webhook_configs"][0]["url"] = webhook.url
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am_cfg))
    am_port = free_port()
    start([am_bin, f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am'}",
           f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=", "--log.level=warn"],
          tmp_path / "alertmanager.log", request)
    am_url = f"http://127.0.0.1:{am_port}"
    wait_for(lambda: requests.get(am_url + "/-/ready", timeout=2).ok, 30, "Alertmanager to be ready")

    static = []
    for namespace, pod, model, ratio in TARGETS:
        if model is None:
            port = free_port()   # nothing listens: up == 0
        else:
            fake = FakeCachemon(model, ratio)
            request.addfinalizer(fake.server.shutdown)
            port = fake.port
        static.append({"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": namespace, "pod": pod}})
    cfg = mconfig.DEFAULT
    groups = generate.rule_groups(cfg, for_override="1s")
    if rules_variant == "pre-fix":
        groups = pre_fix(generate.rule_groups(dataclasses.replace(cfg, target_labels=()), for_override="1s"))
    for rule in groups[1]["rules"]:
        if rule["alert"] == "CachemonExporterAbsent":   # not under test here; absent(up) holds until
            rule["for"] = "1m"                          # the first scrape, which may be after 1s
    (tmp_path / "rules.yaml").write_text(serialise.to_yaml({"groups": list(groups)}))
    prom_cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": cfg.cachemon_job, "static_configs": static}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    prom_port = free_port()
    start([prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
           f"--web.listen-address=127.0.0.1:{prom_port}", "--rules.alert.resend-delay=1s", "--log.level=warn"],
          tmp_path / "prometheus.log", request)

    def am_alerts() -> dict[str, set[tuple]]:
        out: dict[str, set[tuple]] = {"active": set(), "suppressed": set()}
        for a in requests.get(am_url + "/api/v2/alerts", timeout=5).json():
            out.setdefault(a["status"]["state"], set()).add(key(a["labels"]))
        return out

    expected, suppressed = EXPECTED[rules_variant], SUPPRESSED[rules_variant]
    seen: list[dict] = [{}]

    def settled() -> bool:
        seen[0] = am_alerts()
        return seen[0]["active"] == expected and seen[0]["suppressed"] == suppressed
    try:
        wait_for(settled, 90, "Alertmanager's active and inhibited alerts")
    except AssertionError:
        raise AssertionError(f"Alertmanager holds {seen[0]}; wanted active {expected}, inhibited {suppressed}") from None
    wait_for(lambda: webhook.received() == expected, 30, "the webhook to receive every active alert")
    time.sleep(3)   # several group_intervals: nothing else may arrive
    assert webhook.received() == expected
    by_key = {key(a["labels"]): a for a in webhook.alerts}
    if rules_variant == "shipped":
        assert by_key[(LOW, "warning", "ns-b", "b-0", "m2")]["annotations"]["description"].startswith(
            "Prefix-cache hit ratio of model m2 on 127.0.0.1:")


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "alertmanager.yml"


def test_the_example_config_holds_the_warning_until_its_critical_inhibits_it(tmp_path, request):
    """examples/alertmanager.yml under a real Alertmanager, its timings scaled by 1/30 as the demo stack
    scales them: a CONSTRUCTED collapse whose warning fires 4.5 minutes (scaled: 9 s) before its critical,
    near the longest a 5m-window ratio takes to fall from the warning to the critical threshold (the demo
    measured 70 s). Only the critical may be sent: with the old single group_wait of 30 s the warning
    paged first."""
    import importlib.util
    am_bin = require_binary("alertmanager", "prometheus-alertmanager", "prometheus-alertmanager")
    spec = importlib.util.spec_from_file_location("demo_stack", EXAMPLE.parents[1] / "scripts" / "demo_stack.py")
    demo_stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_stack)
    scale = 1 / 30
    webhook = Webhook()
    request.addfinalizer(webhook.server.shutdown)
    text = demo_stack.scaled(EXAMPLE.read_text(), scale)
    assert "http://cachemon:5001/alerts" in text                # the compose demo's receiver, replaced here
    text = text.replace("http://cachemon:5001/alerts", webhook.url)
    (tmp_path / "alertmanager.yml").write_text(text)
    am_port = free_port()
    start([am_bin, f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am'}",
           f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=", "--log.level=warn"],
          tmp_path / "alertmanager.log", request)
    am_url = f"http://127.0.0.1:{am_port}"
    wait_for(lambda: requests.get(am_url + "/-/ready", timeout=2).ok, 30, "Alertmanager to be ready")

    model = {"alertname": LOW, "namespace": "ns-a", "instance": "a-0", "upstream": "vllm", "model_name": "m1"}
    began = time.time()
    gap = 4.5 * 60 * scale
    while time.time() - began < gap + 6 * 60 * scale + 4:      # past the warning's scaled group_wait
        firing = ["warning"] + (["critical"] if time.time() - began >= gap else [])
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        requests.post(am_url + "/api/v2/alerts", timeout=5, json=[    # as Prometheus resends them
            {"labels": dict(model, severity=sev), "startsAt": now,
             "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))} for sev in firing]
        ).raise_for_status()
        time.sleep(0.5)
    sent = [(a["labels"]["severity"], a["labels"]["model_name"]) for a in webhook.alerts]
    assert ("critical", "m1") in sent and ("warning", "m1") not in sent, sent
