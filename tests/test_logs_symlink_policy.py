"""Symlinks in a watched glob or directory (docs/log-source.md, "Symlinks in a glob or directory").

The attack: cachemon runs as root over a log directory, and a `shadow.log` symlink to a 0600
root-owned file is planted there; before, that file's rule matches were exported as labels
("secret in /metrics"), also with a directory `dir.log` and a symlink loop beside it.
Log lines are CONSTRUCTED (a gateway-style line whose model name the rule exports).
"""
from __future__ import annotations

import os

import pytest

from cachemon.expose.render import render
from logs_support import config, source

RULE = {"name": "gw", "regex": r"model=(?P<model>\w+) cache_hit=(?P<hit>\d+) cache_miss=(?P<miss>\d+)",
        "counters": {"hit_tokens": "hit", "miss_tokens": "miss"}, "labels": {"model_name": {"group": "model"}}}


def models(src) -> set[str]:
    return {labels[0] for (_, labels) in src.entries[0].stream.counters}


def refused(src) -> dict[str, int]:
    return dict(src.entries[0].follower.refused)


@pytest.fixture
def watched(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "real.log").write_text("model=real cache_hit=3 cache_miss=1\n")
    secret = tmp_path / "secret"
    secret.write_text("model=hunter2 cache_hit=1 cache_miss=1\n")
    os.chmod(secret, 0o600)
    return d, secret


@pytest.mark.parametrize("spec", ["dir", "glob"])
def test_a_planted_symlink_a_loop_and_a_directory_are_not_read(tmp_path, watched, spec):
    d, secret = watched
    (d / "shadow.log").symlink_to(secret)                   # same owner as the directory, outside it
    (d / "loop.log").symlink_to(d / "loop.log")             # ELOOP
    (d / "dangling.log").symlink_to(d / "gone")
    (d / "dir.log").mkdir()
    path = f"{d}/" if spec == "dir" else str(d / "*.log")
    src = source(config([path], tmp_path, from_beginning=True, state=False, rules=(RULE,)))
    for _ in range(3):
        src.clock.advance(1)
        src.poll()
    assert models(src) == {"real"}
    assert refused(src) == {"symlink": 3}                  # each once, however many polls
    page = render([src]).decode()
    assert "hunter2" not in page
    assert 'cachemon_log_files_refused_total{upstream="log0",reason="symlink"} 3.0' in page
    assert [f.path for f in src.entries[0].follower.files.values()] == [str(d / "real.log")]


def test_a_link_beside_its_target_of_the_directorys_owner_is_followed(tmp_path, watched):
    d, _ = watched
    (d / "vllm.20261202").write_text("model=rotated cache_hit=5 cache_miss=1\n")
    (d / "current.log").symlink_to(d / "vllm.20261202")
    src = source(config([f"{d}/"], tmp_path, from_beginning=True, state=False, rules=(RULE,)))
    src.poll()
    assert models(src) == {"real", "rotated"} and refused(src) == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_link_beside_it_to_another_owners_file_is_refused(tmp_path, watched):
    d, _ = watched
    other = d / "other.txt"
    other.write_text("model=other cache_hit=5 cache_miss=1\n")
    os.chown(other, 4102, 4102)
    (d / "o.log").symlink_to(other)
    src = source(config([f"{d}/"], tmp_path, from_beginning=True, state=False, rules=(RULE,)))
    src.poll()
    assert models(src) == {"real"} and refused(src) == {"symlink": 1}


def test_follow_symlinks_true_follows_them(tmp_path, watched):
    d, secret = watched
    (d / "shadow.log").symlink_to(secret)
    cfg = config([f"{d}/"], tmp_path, from_beginning=True, state=False, rules=(RULE,), follow_symlinks=True)
    src = source(cfg)
    src.poll()
    assert models(src) == {"real", "hunter2"} and refused(src) == {}


def test_a_configured_plain_path_that_is_a_symlink_is_followed(tmp_path, watched):
    d, _ = watched
    (tmp_path / "here.log").symlink_to(d / "real.log")
    src = source(config([tmp_path / "here.log"], tmp_path, from_beginning=True, state=False, rules=(RULE,)))
    src.poll()
    assert models(src) == {"real"} and refused(src) == {}


def test_a_symlink_under_a_rotated_name_of_a_plain_path_is_not_read(tmp_path, watched):
    # the rotated-name scan globs PATH*: a planted `real.log.1 -> secret` is a glob match too
    d, secret = watched
    (d / "real.log.1").symlink_to(secret)
    src = source(config([d / "real.log"], tmp_path, from_beginning=True, state=False, rules=(RULE,)))
    src.poll()
    assert models(src) == {"real"} and refused(src) == {"symlink": 1}
