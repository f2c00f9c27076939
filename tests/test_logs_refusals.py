"""Issue 17 item 10: the log source never tails cachemon's own output, and (running as root)
never reads a file the service user could not read.

Before: with `--log-level debug` and cachemon's stderr inside the watched glob, cachemon read its
own lines and wrote more (a 2.4 MiB/s loop at 86 % of a core); as root, a log symlink switched to
another user's 0600 file had that file's rule matches exported as model_name. Each refusal is
logged once and counted in cachemon_log_files_refused_total{reason}.
Log lines here are constructed (a gateway-style line with a model name the rule exports).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
import requests

from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.sources.logs.settings import parse_log_config
from helpers import eventually, free_port, samples, value
from logs_support import Clock, config, source

MODEL_RULE = {"name": "gw", "regex": r"model=(?P<model>\w+) cache_hit=(?P<hit>\d+) cache_miss=(?P<miss>\d+)",
              "counters": {"hit_tokens": "hit", "miss_tokens": "miss"}, "labels": {"model_name": {"group": "model"}}}


def models(src) -> set[str]:
    return {labels[0] for (_, labels) in src.entries[0].stream.counters}


def refused(src) -> dict[str, float]:
    fams = {f.name: f for f in src.collect()}
    fam = fams.get(C.LOG_FILES_REFUSED.name)
    out: dict[str, float] = {}
    for labels, v in (fam.samples if fam else []):
        out[labels.split('reason="')[1].split('"')[0]] = v
    return out


# --- own output --------------------------------------------------------------------------------

def test_a_file_cachemon_logs_to_is_never_tailed(tmp_path, caplog):
    own = tmp_path / "cachemon.log"
    handler = logging.FileHandler(own)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        (tmp_path / "vllm.log").write_text("model=real cache_hit=3 cache_miss=1\n")
        src = source(config([tmp_path / "*.log"], tmp_path, from_beginning=True, state=False, rules=(MODEL_RULE,)))
        logging.getLogger("cachemon.test").warning("model=own cache_hit=7 cache_miss=1")    # in the own log
        with caplog.at_level(logging.DEBUG):
            for _ in range(5):
                src.poll()
                logging.getLogger("cachemon.test").warning("model=own cache_hit=7 cache_miss=1")
        fo = src.entries[0].follower
        assert [f.path for f in fo.files.values()] == [str(tmp_path / "vllm.log")]
        assert models(src) == {"real"}
        assert refused(src) == {"own_output": 1}
        said = [r.getMessage() for r in caplog.records if "cachemon's own output" in r.getMessage()]
        assert len(said) == 1 and str(own) in said[0], said
    finally:
        root.removeHandler(handler)
        handler.close()


@pytest.mark.slow
def test_cachemon_run_with_its_stderr_inside_the_glob_does_not_feed_on_itself(tmp_path):
    """The reported case, end to end: `cachemon run --log-level debug 2>>DIR/cachemon.log --log-file 'DIR/*.log'`."""
    own = tmp_path / "cachemon.log"
    port = free_port()
    with open(own, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{port}",
                                 "--log-level", "debug", "--log-file", str(tmp_path / "*.log"), "--from-beginning",
                                 "--state-file", "none"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        def refused_page() -> dict | None:
            page = samples(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text)
            return page if value(page, "cachemon_log_files_refused_total", reason="own_output") == 1 else None
        page = eventually(refused_page, 20, "its own log refused", interval=0.2, ignore=(requests.RequestException,))
        assert value(page, "cachemon_log_read_bytes_total") == 0
        size = own.stat().st_size
        time.sleep(1.0)
        assert own.stat().st_size - size < 64 * 1024     # no loop: before, MiB per second
    finally:
        proc.terminate()
        proc.wait(10)
    assert own.read_text().count("cachemon's own output") == 1


# --- as root: files the service user could not read ----------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the ownership check applies only when running as root")
SERVICE, OTHER = 4101, 4102       # uids of no account: ownership is all that matters


@pytest.fixture
def watched(tmp_path):
    """A log directory owned by the service user, a symlink in it, and another user's 0600 file."""
    d = tmp_path / "logs"
    d.mkdir()
    os.chown(d, SERVICE, SERVICE)
    good = d / "current.txt"     # not under a rotated name of server.log
    good.write_text("model=real cache_hit=3 cache_miss=1\n")
    os.chown(good, SERVICE, SERVICE)
    os.chmod(good, 0o600)
    secret = tmp_path / "secret"
    secret.write_text("model=hunter2 cache_hit=1 cache_miss=1\n")
    os.chown(secret, OTHER, OTHER)
    os.chmod(secret, 0o600)
    link = d / "server.log"
    link.symlink_to(good)
    return d, link, good, secret


def _switch(link, target) -> None:
    tmp = link.with_name("tmp-link")
    tmp.symlink_to(target)
    os.replace(tmp, link)


@needs_root
def test_a_symlink_switched_to_another_users_0600_file_is_refused(tmp_path, watched, caplog):
    d, link, good, secret = watched
    src = source(config([link], tmp_path, from_beginning=True, state=False, rules=(MODEL_RULE,)))
    src.poll()
    assert models(src) == {"real"}
    _switch(link, secret)
    with caplog.at_level(logging.INFO):
        for _ in range(4):
            src.clock.advance(1)
            src.poll()
    assert "hunter2" not in models(src)
    assert refused(src) == {"foreign_owner": 1}
    said = [r.getMessage() for r in caplog.records if "could not read" in r.getMessage()]
    assert len(said) == 1 and f"uid {OTHER}" in said[0] and f"uid {SERVICE}" in said[0], said


@needs_root
def test_world_readable_or_expected_owner_files_are_read(tmp_path, watched):
    d, link, good, secret = watched
    os.chmod(secret, 0o644)                       # anyone could read it: nothing to protect
    _switch(link, secret)
    src = source(config([link], tmp_path, from_beginning=True, state=False, rules=(MODEL_RULE,)))
    src.poll()
    assert models(src) == {"hunter2"} and refused(src) == {}
    os.chmod(secret, 0o600)
    cfg = config([link], tmp_path, from_beginning=True, state=False, rules=(MODEL_RULE,))
    cfg.expected_owner = (OTHER, OTHER)           # logs.expected_owner: the file's owner
    src = source(cfg, Clock())
    src.poll()
    assert models(src) == {"hunter2"} and refused(src) == {}


@needs_root
def test_a_group_readable_file_of_the_expected_group_is_read(tmp_path, watched):
    d, link, good, secret = watched
    os.chown(secret, OTHER, SERVICE)
    os.chmod(secret, 0o640)
    _switch(link, secret)
    src = source(config([link], tmp_path, from_beginning=True, state=False, rules=(MODEL_RULE,)))
    src.poll()
    assert models(src) == {"hunter2"}
    os.chown(secret, OTHER, OTHER)                # group-readable, but by another group
    src = source(config([link], tmp_path, from_beginning=True, state=False, rules=(MODEL_RULE,)), Clock())
    src.poll()
    assert models(src) == set() and refused(src) == {"foreign_owner": 1}


def test_expected_owner_config_key():
    cfg = parse_log_config({"files": ["/x.log"], "expected_owner": "root"})
    assert cfg.expected_owner == (0, 0)
    assert parse_log_config({"files": ["/x.log"], "expected_owner": 4101}).expected_owner == (4101, -1)
    with pytest.raises(ConfigError) as e:
        parse_log_config({"files": ["/x.log"], "expected_owner": "no-such-user-cachemon"})
    assert e.value.key == "logs.expected_owner"
