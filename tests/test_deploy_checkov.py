"""checkov (https://www.checkov.io) at 0 failures on everything cachemon ships for deployment.

deploy/ (Kubernetes manifests, kustomize builds, the secrets scan), the Containerfile (checkov reads
it as the Dockerfile it is) and the GitHub workflows. Every skipped check carries its reason: the
annotations checkov.io/skipN on workloads (deploy.CHECKOV_SKIPS), `# checkov:skip=ID: reason`
comments in the Containerfile and on the recording-rule names the secrets scan mistakes for secrets.

checkov pins old versions of common packages (packaging, networkx, ...), so it lives in a venv of its
own: CHECKOV=/path/to/checkov, else `checkov` on PATH. Skipped without it locally, a failure under CI:
    python3 -m venv /opt/checkov && /opt/checkov/bin/pip install checkov && export CHECKOV=/opt/checkov/bin/checkov
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cachemon.monitoring import deploy
from cachemon.monitoring import site as mconfig
from helpers import in_ci

pytestmark = pytest.mark.slow     # runs checkov: a separate process

ROOT = Path(__file__).resolve().parents[1]


def checkov() -> str:
    exe = os.environ.get("CHECKOV") or shutil.which("checkov") or str(ROOT / ".tools" / "checkov" / "bin" / "checkov")
    if exe and Path(exe).is_file():
        return exe
    msg = ("checkov not found (`make test-deps` installs it into .tools/checkov; or set CHECKOV or put it on PATH: "
           "python3 -m venv /opt/checkov && /opt/checkov/bin/pip install checkov)")
    if in_ci():
        pytest.fail(f"{msg}; CI is set, so this is an error, not a skip")
    pytest.skip(msg)


def run_checkov(*args: str) -> list[dict]:
    """checkov's JSON report as a list of per-framework reports (it prints one object for one framework)."""
    r = subprocess.run([checkov(), *args, "--skip-download", "--output", "json"], capture_output=True, text=True,
                       check=False, timeout=600, cwd=ROOT, env=dict(os.environ, LOG_LEVEL="ERROR"))
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-2000:]      # 1: failed checks
    report = json.loads(r.stdout)
    return report if isinstance(report, list) else [report]


def failures(reports: list[dict]) -> list[str]:
    return [f"{c['check_id']} {c['file_path']}:{c['file_line_range']} {c.get('resource', '')}"
            for rep in reports for c in rep["results"].get("failed_checks", [])]


def skips(reports: list[dict]) -> list[tuple[str, str]]:
    return [(c["check_id"], (c.get("check_result") or {}).get("suppress_comment", ""))
            for rep in reports for c in rep["results"].get("skipped_checks", [])]


@pytest.fixture(scope="module")
def containerfile_dir(tmp_path_factory) -> Path:
    """checkov finds Dockerfiles by name: the Containerfile, copied as one."""
    d = tmp_path_factory.mktemp("containerfile")
    shutil.copy(ROOT / "Containerfile", d / "Dockerfile")
    return d


@pytest.mark.parametrize("target", ["deploy", "containerfile", "workflows"])
def test_checkov_finds_no_failure_and_every_skip_has_a_reason(target, containerfile_dir):
    args = {
        "deploy": ["--directory", "deploy", "--framework", "kubernetes", "kustomize", "secrets"],
        "containerfile": ["--file", str(containerfile_dir / "Dockerfile"), "--framework", "dockerfile"],
        "workflows": ["--directory", ".github", "--framework", "github_actions"],
    }[target]
    reports = run_checkov(*args)
    assert sum(rep["summary"]["passed"] for rep in reports) > 0, "checkov checked nothing"
    assert failures(reports) == []
    for check, reason in skips(reports):
        assert len(reason) > 20, (check, reason)
    if target == "deploy":
        assert {check for check, _ in skips(reports)} == set(deploy.CHECKOV_SKIPS)
    if target == "containerfile":
        assert {check for check, _ in skips(reports)} == {"CKV_DOCKER_2", "CKV_DOCKER_7"}


def test_checkov_fails_the_example_without_its_documented_skips(tmp_path):
    """So the test above could fail: the same Deployment without the skip annotations fails exactly those checks."""
    cfg = mconfig.DEFAULT
    dep = deploy.deployment(cfg)
    del dep["metadata"]["annotations"]
    policy = deploy.network_policy(cfg, "vllm-tiny", deploy.LABELS, ["http", "cachemon-metrics"])
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump_all([dep, policy]))
    reports = run_checkov("--file", str(tmp_path / "deployment.yaml"), "--framework", "kubernetes")
    assert sorted({f.split()[0] for f in failures(reports)}) == sorted(deploy.CHECKOV_SKIPS)
