"""What the docs count is what the shipped files hold: docs/deploy.md's "N core resources" and
"R + A rules", and the documents docs/README.md sends a reader to for the release workflow."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OPERATOR_API = "monitoring.coreos.com/"


def _docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


def test_deploy_md_counts_the_core_resources_and_rules_that_ship():
    text = (ROOT / "docs" / "deploy.md").read_text()
    core = sum(1 for f in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")) if f.name != "kustomization.yaml"
               for d in _docs(f"deploy/kubernetes/{f.name}") if not d["apiVersion"].startswith(OPERATOR_API))
    (said,) = re.findall(r"# (\d+) core resources passed", text)
    assert int(said) == core
    recording = sum(len(g["rules"]) for g in _docs("prometheus/recording_rules.yaml")[0]["groups"])
    alerts = sum(len(g["rules"]) for g in _docs("alerts/cachemon-alerts.yaml")[0]["groups"])
    (pair,) = re.findall(r"# (\d+) \+ (\d+) rules", text)
    assert (int(pair[0]), int(pair[1])) == (recording, alerts)


def test_docs_readme_names_the_release_workflow_where_it_is():
    text = (ROOT / "docs" / "README.md").read_text()
    for path in re.findall(r"`(\.github/workflows/[\w.-]+)`", text):
        assert (ROOT / path).is_file(), path
    assert ".github/workflows/release.yml" in text
    # the document it sends readers to for the image and the namespace says so
    k8s = (ROOT / "deploy" / "kubernetes" / "README.md").read_text()
    assert "kubectl create namespace" in k8s and "newName:" in k8s and "make image IMAGE=" in k8s


def test_the_readme_shows_the_pictures_the_demo_test_draws():
    text = (ROOT / "README.md").read_text()
    for image in re.findall(r"\]\((docs/images/[\w.-]+\.png)\)", text):
        data = (ROOT / image).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", image
    assert "![" in text and "docs/images/overview-story.png" in text
