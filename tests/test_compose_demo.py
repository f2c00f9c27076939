"""The compose demo's Alertmanager reaches its receiver (deploy/compose/demo.yaml).

Inside compose, 127.0.0.1 is a container's own address: the webhook URL of the Alertmanager config the
compose file mounts must name a service of the compose file, on a port that service listens on
(`cachemon demo --alert-webhook`), and that receiver must print what Alertmanager posts.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "compose" / "demo.yaml"


def _mounted_config(service: dict, target: str) -> Path:
    """The host file a compose service mounts at ``target`` (short volume syntax, relative to the file)."""
    for volume in service["volumes"]:
        source, dest = volume.split(":")[:2]
        if dest == target:
            return (COMPOSE.parent / source).resolve()
    raise AssertionError(f"nothing mounted at {target}: {service['volumes']}")


def test_the_alertmanager_webhook_names_a_compose_service_that_listens_there():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    am = services["alertmanager"]
    flag = next(a for a in am["command"] if a.startswith("--config.file="))
    config = yaml.safe_load(_mounted_config(am, flag.split("=", 1)[1]).read_text())
    urls = [w["url"] for r in config["receivers"] for w in r.get("webhook_configs", [])]
    assert urls, "the demo's Alertmanager has no webhook receiver"
    for url in urls:
        parts = urlsplit(url)
        assert parts.hostname in services, f"{url}: {parts.hostname} is no service of {COMPOSE.name} ({sorted(services)})"
        assert parts.hostname not in ("127.0.0.1", "localhost", "alertmanager")
        receiver = services[parts.hostname]
        listens = [a.split("=", 1)[1] for a in receiver.get("command", []) if a.startswith("--alert-webhook=")]
        assert listens == [f"0.0.0.0:{parts.port}"], f"{parts.hostname} does not receive on :{parts.port}: {listens}"


@pytest.mark.slow
def test_cachemon_demo_prints_what_alertmanager_posts_to_its_webhook():
    """The receiver the compose file names, as it runs: `cachemon demo --alert-webhook`, one POST of
    Alertmanager's webhook JSON (version 4; the alert is constructed, its labels the shipped rule's)."""
    hook, port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "demo", "--listen", f"127.0.0.1:{port}",
                             "--vllm-listen", "127.0.0.1:0", "--no-kv-events", "--alert-webhook", f"127.0.0.1:{hook}",
                             "--duration", "8s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    payload = {"version": "4", "status": "firing", "receiver": "cachemon-webhook", "alerts": [{
        "status": "firing",
        "labels": {"alertname": "CachemonPrefixCacheHitRatioLow", "severity": "critical", "upstream": "demo",
                   "model_name": "tiny"},
        "annotations": {"description": "hit ratio 0% below the 60% critical threshold. Active cause(s): dynamic_prefix"},
    }]}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{hook}/alerts", data=json.dumps(payload).encode(),
                                             headers={"Content-Type": "application/json"})
                assert urllib.request.urlopen(req, timeout=5).status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the demo's webhook never listened"
                time.sleep(0.2)
        bad = urllib.request.Request(f"http://127.0.0.1:{hook}/alerts", data=b"not json")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bad, timeout=5)
        assert e.value.code == 400
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"Alertmanager webhook: http://127.0.0.1:{hook}/alerts" in out
    line = next(x for x in out.splitlines() if x.startswith("NOTIFICATION firing"))
    assert "CachemonPrefixCacheHitRatioLow (critical) upstream=demo model=tiny" in line
    assert "Active cause(s): dynamic_prefix" in line and "[received " in line
    assert "NOTIFICATION not understood (8 bytes" in out
