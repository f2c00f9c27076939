
"""The rendered compose stack and systemd unit, checked with the tools users would trust.

Compose: the Compose Specification's JSON schema (as shipped by check-jsonschema; no docker
here) plus the relations the schema cannot express. systemd: `systemd-analyze security
--offline=yes` for the exposure score and `systemd-analyze verify` for the unit itself.
"""
from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cachemon.monitoring import deploy
from helpers import require_binary

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
UNIT = ROOT / "deploy" / "systemd" / "cachemon.service"
MAX_EXPOSURE = 4.5          # Debian's own prometheus.service scores 4.0


def check_compose_schema(path: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run([str(exe), "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.slow
def test_compose_file_matches_the_compose_spec_schema(tmp_path):
    assert check_compose_schema(COMPOSE.parent / "demo.yaml").returncode == 0    # `make demo-stack`'s, with Grafana
    r = check_compose_schema(COMPOSE)
    assert r.returncode == 0, r.stdout + r.stderr
    # The schema check can fail: an unknown depends_on condition is rejected.
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["prometheus"]["depends_on"]["cachemon"]["condition"] = "service_ready"
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    assert check_compose_schema(tmp_path / "compose.yaml").returncode != 0


def test_compose_builds_the_containerfile_and_waits_on_healthchecks():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    build = services["cachemon"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == ROOT / "Containerfile"
    for name, svc in services.items():
        assert svc["healthcheck"]["test"][0] == "CMD", name
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, (name, dep)
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)
    assert services["prometheus"]["depends_on"]["cachemon"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    # The cachemon healthcheck polls the port cachemon listens on.
    listen = next(a for a in services["cachemon"]["command"] if a.startswith("--listen="))
    assert f":{listen.rsplit(':', 1)[1]}/" in services["cachemon"]["healthcheck"]["test"][-1]


def test_compose_runs_cachemon_non_root_on_a_read_only_root_with_its_state_volume():
    compose = yaml.safe_load(COMPOSE.read_text())
    svc = compose["services"]["cachemon"]
    assert svc["user"] == "65534:65534" and svc["read_only"] is True
    assert svc["cap_drop"] == ["ALL"] and "no-new-privileges:true" in svc["security_opt"]
    assert "/tmp" in svc["tmpfs"]
    volume, target = svc["volumes"][0].split(":")
    assert volume in compose["volumes"] and target == "/var/lib/cachemon"
    # ... the path the image's XDG_STATE_HOME puts the log tailer's state under.
    assert "XDG_STATE_HOME=/var/lib" in (ROOT / "Containerfile").read_text().replace(" ", "")


def test_grafana_is_not_anonymous_unless_the_user_turns_it_on():
    env = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]["environment"]
    # Compose interpolation: ${GRAFANA_ANONYMOUS:-false} is "false" unless the variable is set.
    m = re.fullmatch(r"\$\{(\w+):-(\w+)\}", env["GF_AUTH_ANONYMOUS_ENABLED"])
    assert m and m.group(2) == "false"
    assert m.group(1) in (ROOT / "docs" / "deploy.md").read_text()


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str
    cp.read_string(UNIT.read_text())
    return cp


def _exposure(unit: Path) -> float:
    exe = require_binary("systemd-analyze", "systemd")
    r = subprocess.run([exe, "security", "--offline=yes", str(unit)], capture_output=True, text=True, check=False, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


@pytest.mark.slow
def test_systemd_unit_exposure_score_is_at_most_prometheus_level(tmp_path):
    assert _exposure(UNIT) <= MAX_EXPOSURE
    # The score reacts to hardening: the unit without its [Service] sandboxing scores far worse.
    bare = "\n".join(line for line in UNIT.read_text().splitlines()
                     if not line.startswith(("Protect", "Restrict", "Private", "SystemCall", "Capability",
                                          "NoNewPrivileges", "LockPersonality", "DynamicUser")))
    (tmp_path / "cachemon.service").write_text(bare)
    assert _exposure(tmp_path / "cachemon.service") > 8


def test_systemd_unit_does_not_restart_loop_on_config_errors():
    service = _unit()["Service"]
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"


@pytest.mark.slow
def test_systemd_unit_verifies_and_runs_what_the_documented_install_produces(tmp_path):
    exe = require_binary("systemd-analyze", "systemd")
    exec_start = _unit()["Service"]["ExecStart"].split()[0]
    assert exec_start == deploy.SYSTEMD_EXEC == "/opt/cachemon/bin/cachemon"
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "python3 -m venv /opt/cachemon" in doc and "/opt/cachemon/bin/pip install" in doc
    # A venv puts console scripts in <venv>/bin: verify the unit with this venv's cachemon there.
    here = Path(sys.executable).parent / "cachemon"
    unit = tmp_path / "cachemon.service"
    unit.write_text(UNIT.read_text().replace(exec_start, str(here)))
    r = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    # verify reports what systemd would ignore, so the empty output above means something.
    unit.write_text(UNIT.read_text().replace(exec_start, str(here)).replace("[Service]", "[Service]\nBogusKey=1"))
    r = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60)
    assert "Unknown key 'BogusKey'" in r.stdout + r.stderr


def test_systemd_state_directory_is_where_the_log_tailer_writes():
    service = _unit()["Service"]
    assert service["StateDirectory"] == "cachemon" and service["Environment"] == "XDG_STATE_HOME=%S"


def test_systemd_install_steps_name_what_exists_not_an_unpublished_package():
    """cachemon is not on PyPI: the unit's install comment installs from a clone or a built wheel."""
    comment = [line.removeprefix("#   ") for line in UNIT.read_text().splitlines() if line.startswith("#   ")]
    assert comment == deploy.systemd_install_lines()
    pip = [line for line in comment if "pip install" in line]
    assert pip and not [line for line in pip if re.search(r"pip install cachemon(\s|$|\[)", line)], pip
    assert "/opt/cachemon/bin/pip install ./cachemon" in comment        # the clone's directory: this repository
    # The wheel the comment names is the file `python -m build` writes (tests/test_packaging.py installs it).
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and f"cachemon-{version.group(1)}-py3-none-any.whl" in " ".join(pip)
    # `cp cachemon/deploy/...` copies this very file from the clone.
    cp = next(line for line in comment if line.startswith("cp "))
    assert (ROOT / cp.split()[1].removeprefix("cachemon/")) == UNIT
