"""Issue 37: a config typo (`poll_intervall`) got "unknown key" and the list of allowed keys, but no
"did you mean". Every section reads its keys through ``check_keys``: each key of every section,
mistyped the usual ways (constructed typos), is answered with the key it most likely means."""
from __future__ import annotations

import dataclasses
import importlib

import pytest

from cachemon.config import ConfigError, load_section
from cachemon.config.sections import section_parsers
from helpers import one_line_error

MODULES = ("cachemon.runconfig", "cachemon.config", "cachemon.config.kv", "cachemon.config.listen",
           "cachemon.web.web_config", "cachemon.sources.logs.settings", "cachemon.runtime.warmup",
           "cachemon.runtime.attribution_stage", "cachemon.runtime.cost", "cachemon.runtime.change_detector",
           "cachemon.monitoring.site")


def sections() -> list[type]:
    found: dict[str, type] = {}
    for name in MODULES:
        for obj in vars(importlib.import_module(name)).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and section_parsers(obj):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def typos(key: str) -> list[str]:
    """A doubled last letter, a dropped letter, two letters swapped, a dash for an underscore."""
    out = [key + key[-1], key[:-1] if len(key) > 4 else key + "s"]
    if len(key) > 3:
        out.append(key[:1] + key[2] + key[1] + key[3:])
    if "_" in key:
        out.append(key.replace("_", "-"))
    return out


SECTIONS = sections()


def test_the_sections_are_found():
    names = {cls.__name__ for cls in SECTIONS}
    assert {"Config", "LogConfig", "WebConfigFile", "TlsServerConfig"} <= names, names


@pytest.mark.parametrize("cls", SECTIONS, ids=[f"{c.__module__}.{c.__qualname__}" for c in SECTIONS])
def test_every_key_of_every_section_mistyped_gets_a_did_you_mean(cls):
    keys = section_parsers(cls)
    missed = []
    for key in keys:
        for typo in typos(key):
            if typo in keys:
                continue
            with pytest.raises(ConfigError) as e:
                load_section(cls, {typo: None}, "s")
            if f"did you mean {key!r}?" not in str(e.value):
                missed.append((typo, str(e.value)))
    assert not missed, missed


def test_nothing_close_gets_no_guess(tmp_path):
    from cachemon.runconfig import Config
    with pytest.raises(ConfigError) as e:
        load_section(Config, {"zzzzqqq": 1}, "")
    assert "did you mean" not in str(e.value) and "unknown key" in str(e.value)


def test_cachemon_run_says_did_you_mean_for_poll_intervall(tmp_path):
    cfg = tmp_path / "cachemon.yaml"
    cfg.write_text("poll_intervall: 5s\n")
    line = one_line_error(["run", "--config", str(cfg)])
    assert line.startswith("cachemon: config error: poll_intervall: unknown key, did you mean 'poll_interval'?"), line
