"""Configuration: YAML + flags (flags win), errors naming the key with exit code 2."""
from __future__ import annotations

import subprocess
import sys

import pytest

from cachemon.config import ConfigError, parse_duration, parse_listen
from cachemon.runconfig import build_config, from_dict


def run_cli(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "cachemon.cli", *args], capture_output=True, text=True, timeout=timeout)


def write(tmp_path, text):
    p = tmp_path / "cachemon.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("yaml_text,key", [
    ("upstreams:\n  - url: ftp://x/metrics\n", "upstreams[0].url"),
    ("upstreams:\n  - name: a\n", "upstreams[0].url"),
    ("upstreams:\n  - url: http://a:1/metrics\n    timeout: soon\n", "upstreams[0].timeout"),
    ("upstreams:\n  - url: http://a:1/metrics\n    colour: red\n", "upstreams[0].colour"),
    ("upstreams:\n  - {name: x, url: 'http://a:1/metrics'}\n  - {name: x, url: 'http://b:1/metrics'}\n", "upstreams[1].name"),
    ("poll_interval: -1s\n", "poll_interval"),
    ("windows: [1m, never]\n", "windows[1]"),
    ("listen:\n  port: 99999\n", "listen.port"),
    ("normalise:\n  max_series_per_upstream: 0\n", "normalise.max_series_per_upstream"),
    ("bogus: 1\n", "bogus"),
    ("upstreams: {url: x}\n", "upstreams"),
])
def test_bad_config_names_the_key(tmp_path, yaml_text, key):
    with pytest.raises(ConfigError) as e:
        build_config(write(tmp_path, yaml_text), (), None, None, (), None, None)
    assert e.value.key == key
    assert str(e.value).startswith(key + ":")


@pytest.mark.slow
def test_bad_config_exits_2_with_the_key_on_stderr(tmp_path):
    r = run_cli("run", "--config", write(tmp_path, "listen:\n  port: 'abc'\n"))
    assert r.returncode == 2
    assert "listen.port" in r.stderr


@pytest.mark.slow
def test_invalid_yaml_exits_2_with_the_position(tmp_path):
    r = run_cli("run", "--config", write(tmp_path, "upstreams: [\n  - url: x\n"))
    assert r.returncode == 2
    assert "not valid YAML" in r.stderr and "line" in r.stderr


@pytest.mark.slow
def test_missing_config_file_exits_2(tmp_path):
    r = run_cli("run", "--config", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "cannot read config file" in r.stderr


def test_flags_win_over_the_file(tmp_path):
    path = write(tmp_path, "upstreams:\n  - {name: fromfile, url: 'http://a:1/metrics'}\n"
                           "poll_interval: 10s\nwindows: [2m]\nlisten: {address: 127.0.0.1, port: 1234}\n")
    cfg = build_config(path, ("flag=http://b:2/metrics",), ":5555", "500ms", ("30s", "1h"), None, 7)
    assert [(u.name, u.url) for u in cfg.upstreams] == [("flag", "http://b:2/metrics")]
    assert (cfg.listen.address, cfg.listen.port) == ("0.0.0.0", 5555)
    assert cfg.poll_interval == 0.5
    assert cfg.windows == {"30s": 30.0, "1h": 3600.0}
    assert cfg.max_series_per_upstream == 7
    file_only = build_config(path, (), None, None, (), None, None)
    assert file_only.upstreams[0].name == "fromfile" and file_only.poll_interval == 10 and file_only.listen.port == 1234


def test_defaults():
    cfg = build_config(None, (), None, None, (), None, None)
    assert cfg.upstreams[0].url == "http://127.0.0.1:8000/metrics"
    assert cfg.listen.port == 9867 and cfg.poll_interval == 5.0
    assert cfg.windows == {"1m": 60.0, "5m": 300.0}


def test_helpers():
    assert parse_duration("250ms", "k") == 0.25 and parse_duration("2h", "k") == 7200
    assert parse_listen("127.0.0.1:9") == ("127.0.0.1", 9) and parse_listen("[::1]:9") == ("::1", 9)
    assert parse_listen("9") == ("0.0.0.0", 9)
    assert from_dict({}).upstreams == []


@pytest.mark.slow
def test_busy_port_is_a_clear_error():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("run", "--listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:1/metrics")
    assert r.returncode == 1 and "cannot listen on" in r.stderr


@pytest.mark.slow
def test_help_lists_every_command():
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("run", "check", "demo"):
        assert cmd in r.stdout


def test_a_log_source_may_not_reuse_an_upstream_name(tmp_path):
    # Both label the same series (`upstream`): a clash would merge two sources' counters.
    path = write(tmp_path, "upstreams:\n  - {name: vllm, url: 'http://a:1/metrics'}\n"
                           "logs:\n  files:\n    - {path: /var/log/x.log, name: vllm}\n")
    with pytest.raises(ConfigError) as e:
        build_config(path, (), None, None, (), None, None)
    assert e.value.key == "logs.files[0].name"


def test_a_null_name_is_derived_like_a_missing_one(tmp_path):
    """Constructed config: `name: null` (YAML's null) names an upstream, a router and a log file as
    leaving the name out does; never None in a label."""
    path = write(tmp_path, "upstreams:\n  - {name: null, url: 'http://a:1/metrics'}\n"
                           "routers:\n  - {name: null, kind: vllm-router, url: 'http://r:2/metrics'}\n"
                           "logs:\n  files:\n    - {path: /var/log/x.log, name: null}\n")
    cfg = build_config(path, (), None, None, (), None, None)
    assert cfg.upstreams[0].name == "a:1"
    assert cfg.routers[0].name == "r:2"
    assert cfg.logs is not None and cfg.logs.files[0].name == "log:x.log"


def test_a_subcommand_that_cannot_be_imported_fails_clearly(monkeypatch):
    from click.testing import CliRunner

    from cachemon import cli
    monkeypatch.setitem(cli.LAZY, "ghost", "cachemon.no_such_module:cmd")
    r = CliRunner().invoke(cli.main, ["ghost"])
    assert r.exit_code == 2
    assert "'cachemon ghost' is unavailable" in r.output
