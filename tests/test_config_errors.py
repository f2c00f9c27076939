"""Every config error is ONE line naming the key path, exit code 2, never a traceback.

Each case here crashed, hung or was silently accepted before the typed config loader
(issue 10): a non-UTF-8 file, ``web_config_file: 5``, a broken IPv6 URL, an unknown key in
the monitoring generator's config, non-finite or absurd durations and ports out of range.
(A log state file with a valid checksum over content of the wrong type: test_logs_restart.py.)
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from assert_support import nonempty
from cachemon.config import ConfigError, parse_duration
from cachemon.runconfig import build_config
from helpers import one_line_error


def write(tmp_path, text: str | bytes, name: str = "cachemon.yaml") -> str:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


@pytest.mark.parametrize("yaml_text, key", [
    ("listen:\n  web_config_file: 5\n", "listen.web_config_file"),
    ("upstreams:\n  - 'http://[::1/metrics'\n", "upstreams[0].url"),
    ("upstreams:\n  - url: http://a:70000/metrics\n", "upstreams[0].url"),
    ("upstreams:\n  - url: 'http://a:-1/metrics'\n", "upstreams[0].url"),
    ("poll_interval: .inf\n", "poll_interval"),
    ("poll_interval: .nan\n", "poll_interval"),
    ("poll_interval: 99999999999h\n", "poll_interval"),
    ("poll_interval: 1.5h\n", "poll_interval"),
    ("poll_interval: 2\n", "poll_interval"),
    ("upstreams:\n  - url: http://a:1/metrics\n    timeout: 1h\n", "upstreams[0].timeout"),
    ("windows: [1m, .inf]\n", "windows[1]"),
    ("logs:\n  files: [/x.log]\n  rotate_wait: .nan\n", "logs.rotate_wait"),
    ("logs:\n  files: [/x.log]\n  max_line_bytes: .inf\n", "logs.max_line_bytes"),
    ("events:\n  interval: 99999999999h\n", "events.interval"),
    ("events:\n  cache_reset:\n    collapse_fraction: .nan\n", "events.cache_reset.collapse_fraction"),
    ("cost:\n  gpu_hour: {price: .inf, prefill_tokens_per_second: 1}\n", "cost.gpu_hour.price"),
    ("warmup:\n  prompts: 5\n", "warmup.prompts"),
])
def test_run_config_error_is_one_line_naming_the_key(tmp_path, yaml_text, key):
    line = one_line_error(["run", "--config", write(tmp_path, yaml_text)])
    assert line.startswith(f"cachemon: config error: {key}: "), line


def test_non_utf8_config_file(tmp_path):
    line = one_line_error(["run", "--config", write(tmp_path, b"upstreams:\n  - http://a:1/m\xe9trics\n")])
    assert "not valid UTF-8" in line


def test_invalid_ipv6_upstream_flag(tmp_path):
    line = one_line_error(["run", "--upstream", "http://[::1/metrics"])
    assert line.startswith("cachemon: config error: --upstream[0].url: invalid URL")


def test_flags_go_through_the_same_definitions():
    assert "--poll-interval: must be at most 1h" in one_line_error(["run", "--poll-interval", "99999999999h"])
    assert "--max-series: must be between 1 and 1000000" in one_line_error(["run", "--max-series", "0"])
    assert "--window[0]: expected a duration" in one_line_error(["run", "--window", "1.5m"])


def test_web_config_with_wrong_types_is_one_line(tmp_path):
    web = write(tmp_path, "tls_server_config:\n  cert_file: 5\n  key_file: k.pem\n", "web.yml")
    line = one_line_error(["run", "--web-config-file", web])
    assert line.startswith("cachemon: config error: web_config.tls_server_config.cert_file: ")
    web = write(tmp_path, b"basic_auth_users:\n  bob: \xff\n", "web2.yml")
    assert "not valid UTF-8" in one_line_error(["run", "--web-config-file", web])


@pytest.mark.slow
def test_monitoring_config_unknown_key_exits_2_as_a_subprocess(tmp_path):
    site = write(tmp_path, "runbook_url: https://wiki.example\n", "site.yaml")
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "monitoring", "--config", site, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("cachemon monitoring: config error: runbook_url: unknown key")


@pytest.mark.parametrize("yaml_text, key", [
    ("vllm_port: 'eighty'\n", "vllm_port"),
    ("dashboard_tags: tag\n", "dashboard_tags"),
    (b"model: caf\xe9\n", ""),
])
def test_monitoring_config_types_are_checked(tmp_path, yaml_text, key):
    site = write(tmp_path, yaml_text, "site.yaml")
    line = one_line_error(["monitoring", "--config", site, "--out", str(tmp_path)])
    assert line.startswith(f"cachemon monitoring: config error: {key}")


@pytest.mark.slow
def test_run_config_error_as_a_subprocess_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--config",
                        write(tmp_path, "poll_interval: .inf\n")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["cachemon: config error: poll_interval: expected a duration like 250ms, "
                                             "5s, 1m30s or 2h (Prometheus syntax: integers, units y w d h m s ms in "
                                             "that order), got inf"]


# --- durations: Prometheus' grammar, exactly ----------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("250ms", 0.25), ("5s", 5), ("1m", 60), ("1h30m", 5400), ("1d", 86400), ("1w", 604800),
    ("1y", 365 * 86400), ("1y2w3d4h5m6s7ms", 365 * 86400 + 14 * 86400 + 3 * 86400 + 4 * 3600 + 5 * 60 + 6.007),
    ("90m", 5400), ("0", 0),
])
def test_prometheus_durations(text, seconds):
    assert parse_duration(text, "k", lo=0, hi=10 * 365 * 86400) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1.5h", "30m1h", "1s1m", "1h1h", "5", "", " 5s", "5s\n", "5 s", "-1s", "1H", "5sec",
                                  "ms", "1msm", 5, 2.5, True, None, float("inf"), float("nan")])
def test_not_prometheus_durations(text):
    with pytest.raises(ConfigError) as e:
        parse_duration(text, "poll_interval")
    assert e.value.key == "poll_interval"


UNITS = (("y", 365 * 86400), ("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", 0.001))


@given(st.lists(st.one_of(st.none(), st.integers(0, 10_000)), min_size=7, max_size=7))
def test_any_descending_duration_is_the_sum_of_its_parts(amounts):
    parts = [(n, unit, size) for n, (unit, size) in zip(amounts, UNITS, strict=True) if n is not None]
    assume(parts)
    text = "".join(f"{n}{unit}" for n, unit, _ in parts)
    expected = sum(n * size for n, _, size in parts)
    assert parse_duration(text, "k", lo=0, hi=float("inf")) == pytest.approx(expected)
    if len(parts) > 1:   # the same parts in ascending order are not a Prometheus duration
        with pytest.raises(ConfigError):
            parse_duration("".join(f"{n}{unit}" for n, unit, _ in reversed(parts)), "k", lo=0, hi=float("inf"))


def test_durations_are_bounded_per_setting(tmp_path):
    cfg = build_config(write(tmp_path, "poll_interval: 1h\nwindows: [1d]\n"))
    assert cfg.poll_interval == 3600 and cfg.windows == {"24h": 86400.0}
    with pytest.raises(ConfigError) as e:
        build_config(write(tmp_path, "poll_interval: 5ms\n"))
    assert e.value.key == "poll_interval" and "at least 10ms" in str(e.value)


def test_check_reads_its_config_with_the_same_loader(tmp_path):
    """`cachemon check --config` validates the whole file like `cachemon run` (not only `logs:`)."""
    log = write(tmp_path, "", "vllm.log")
    for text, key in nonempty((("poll_interval: .nan\n", "poll_interval"), ("logs:\n  files: [a.log]\n  colour: red\n",
                                                                  "logs.colour"))):
        line = one_line_error(["check", "--config", write(tmp_path, text), "--log-file", log])
        assert line.startswith(f"cachemon: config error: {key}: "), line
