"""Issue 17 item 9: every user-supplied input is bounded, and each refusal is ONE line, exit 2.

Before: a 5000-digit integer and 10 000 levels of nesting gave tracebacks (56 and ~3000 lines),
a FIFO as the web config and a bcrypt cost of 31 hung silently, /dev/zero as the config grew
memory by gigabytes, and a CR LF inside an upstream URL was silently stripped (urlsplit removes
it). Cases that HUNG or ate memory before run as a subprocess with a timeout and an address-space
limit, so that on old code they fail instead of hanging the suite or the machine.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from cachemon.config import MAX_CONFIG_BYTES, MAX_TOKENIZER_FILE_BYTES, ConfigError, parse_upstream_spec, read_small_file
from cachemon.runconfig import build_config
from cachemon.sources.fingerprint import TokenizerDirError, fingerprint_dir
from test_config_errors import one_line_error, write

BCRYPT_53 = "abcdefghijklmnopqrstuvABCDEFGHIJKLMNOPQRSTUVWXYZ01234"   # constructed: 53 chars of the alphabet


def _limit_memory() -> None:
    # 1 GiB of address space: old code reading /dev/zero dies with MemoryError instead of eating the host
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """`cachemon ARGS` as a subprocess; a hang is a test failure, not a hung suite."""
    try:
        return subprocess.run([sys.executable, "-m", "cachemon.cli", *args], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"cachemon {' '.join(args)} hung for {timeout}s")


def assert_one_line_exit_2(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


# --- numbers and nesting in YAML -----------------------------------------------------------------

def test_a_5000_digit_integer_is_one_line_naming_the_key(tmp_path):
    line = one_line_error(["run", "--config", write(tmp_path, "normalise:\n  max_series_per_upstream: "
                                                    + "9" * 5000 + "\n")])
    assert line.startswith("cachemon: config error: normalise.max_series_per_upstream: "), line
    assert "5000 digits" in line and len(line) < 300


def test_a_huge_integer_inside_a_list_names_its_index(tmp_path):
    with pytest.raises(ConfigError) as e:
        build_config(write(tmp_path, "upstreams:\n  - url: http://a:1/metrics\n  - url: http://b:1/metrics\n"
                                     "    max_body_bytes: 0x" + "f" * 5000 + "\n"))
    assert e.value.key == "upstreams[1].max_body_bytes"


def test_10000_levels_of_nesting_is_one_line(tmp_path):
    line = one_line_error(["run", "--config", write(tmp_path, "upstreams: " + "[" * 10000 + "]" * 10000 + "\n")])
    assert line.startswith("cachemon: config error: upstreams[0][0]"), line
    assert "nested deeper than" in line and len(line) < 300


def test_deep_nesting_of_mappings_in_the_web_config(tmp_path):
    web = write(tmp_path, "http_server_config:\n  headers: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "web.yml")
    line = one_line_error(["run", "--web-config-file", web])
    assert line.startswith("cachemon: config error: web_config.http_server_config.headers.a"), line


# --- files that are not small regular files ------------------------------------------------------

@pytest.mark.slow
def test_a_fifo_as_the_web_config_is_refused_at_once(tmp_path):
    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)
    line = assert_one_line_exit_2(run_cli("run", "--web-config-file", str(fifo)))
    assert str(fifo) in line and "FIFO" in line and "not a regular file" in line, line


@pytest.mark.slow
def test_a_fifo_named_in_the_yaml_as_web_config(tmp_path):
    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)
    cfg = write(tmp_path, f"listen:\n  web_config_file: {fifo}\n")
    line = assert_one_line_exit_2(run_cli("run", "--config", cfg))
    assert "FIFO" in line, line


@pytest.mark.slow
def test_dev_zero_as_the_config_is_refused_without_reading_it():
    line = assert_one_line_exit_2(run_cli("run", "--config", "/dev/zero"))
    assert "/dev/zero" in line and "character device" in line, line


def test_a_directory_as_the_web_config(tmp_path):
    cfg = write(tmp_path, f"listen:\n  web_config_file: {tmp_path}\n")
    line = one_line_error(["run", "--config", cfg])
    assert str(tmp_path) in line and "directory" in line, line


def test_a_config_over_the_size_cap_is_refused_by_its_size(tmp_path):
    p = tmp_path / "huge.yaml"
    with open(p, "wb") as f:          # sparse: costs no disk
        f.truncate(MAX_CONFIG_BYTES + 1)
    line = one_line_error(["run", "--config", str(p)])
    assert str(p) in line and "larger than" in line, line


def test_read_small_file_refuses_a_file_that_grows_past_the_cap_while_read(tmp_path):
    # st_size is only a hint (a file being written, /proc files report 0): the read itself is capped
    with pytest.raises(ConfigError) as e:
        read_small_file("/proc/self/maps", "k", 16, what="test file")
    assert e.value.key == "k" and "larger than 16 bytes" in str(e.value)
    p = tmp_path / "ok"
    p.write_bytes(b"x" * 16)
    assert read_small_file(str(p), "k", 16) == b"x" * 16


# --- bcrypt cost ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_bcrypt_cost_31_is_refused_at_once_naming_the_range(tmp_path):
    web = write(tmp_path, f"basic_auth_users:\n  prom: '$2y$31${BCRYPT_53}'\n", "web.yml")
    line = assert_one_line_exit_2(run_cli("run", "--web-config-file", web, timeout=20))
    assert line.startswith("cachemon: config error: web_config.basic_auth_users.prom: "), line
    assert "cost 31" in line and "between 4 and 14" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("cost", ["15", "16", "03", "99"])
def test_bcrypt_costs_outside_the_range(tmp_path, cost):
    # a subprocess: before, 15 and 16 were accepted and the daemon ran (a hang in-process)
    web = write(tmp_path, f"basic_auth_users:\n  prom: '$2y${cost}${BCRYPT_53}'\n", "web.yml")
    line = assert_one_line_exit_2(run_cli("run", "--listen", "127.0.0.1:0", "--web-config-file", web, timeout=20))
    assert f"cost {int(cost)}" in line and "between 4 and 14" in line, line


# --- control characters in URLs ------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://a:1/me\r\ntrics", "http://a:1/metrics\n", "http://a\t:1/metrics",
                                 "http://a:1/metrics?x=1\x00", "http://a:1/m\x7f"])
def test_control_characters_in_an_upstream_url_are_refused(tmp_path, url):
    import json
    with pytest.raises(ConfigError) as e:      # JSON is YAML: the escapes survive as real characters
        build_config(write(tmp_path, "upstreams:\n  - " + json.dumps(url) + "\n"))
    assert e.value.key == "upstreams[0].url" and "control character" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_upstream_spec(url, "--upstream[0]")
    assert e.value.key == "--upstream[0].url"


# --- tokenizer / chat-template files -------------------------------------------------------------

def test_a_fifo_chat_template_is_an_error_not_skipped(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    os.mkfifo(tmp_path / "chat_template.jinja")
    with pytest.raises(TokenizerDirError) as e:
        fingerprint_dir(tmp_path)
    assert "chat_template.jinja" in str(e.value) and "not a regular file" in str(e.value)


def test_an_oversized_tokenizer_config_is_refused_by_its_size(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    with open(tmp_path / "tokenizer_config.json", "wb") as f:
        f.truncate(MAX_TOKENIZER_FILE_BYTES + 1)     # sparse: old code read it whole
    with pytest.raises(TokenizerDirError) as e:
        fingerprint_dir(tmp_path)
    assert "tokenizer_config.json" in str(e.value) and "larger than" in str(e.value)


# --- the log state file (its path is configurable) ------------------------------------------------

@pytest.mark.slow
def test_a_device_or_fifo_as_the_log_state_file_is_an_unusable_state_not_a_hang(tmp_path):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    code = ("import sys; from pathlib import Path; from cachemon.sources.logs.statefile import StateError, load\n"
            "for p in sys.argv[1:]:\n"
            "    try: load(Path(p))\n"
            "    except StateError as e: print(e)\n"
            f"print(load(Path({str(tmp_path / 'absent.json')!r})))\n")
    try:      # a subprocess: before, both hung (the FIFO) or grew without bound (/dev/zero)
        r = subprocess.run([sys.executable, "-c", code, "/dev/zero", str(fifo)], capture_output=True, text=True,
                           timeout=30, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail("loading a FIFO or /dev/zero as the state file hung")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 3, (r.stdout, r.stderr[-2000:])
    assert "character device" in lines[0] and "FIFO" in lines[1] and lines[2] == "None"
