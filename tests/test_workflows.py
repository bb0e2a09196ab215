"""GitHub Actions workflows: actionlint-clean, and doing what the delivery needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

ACTIONLINT = Path(sys.executable).with_name("actionlint")
WORKFLOWS = ROOT / ".github" / "workflows"


def actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ACTIONLINT), "-no-color", *map(str, paths)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def workflow(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    document["on"] = document.pop(True, document.get("on"))
    return document


def test_actionlint_passes() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["ci.yml", "deploy-aks.yml", "images.yml"]
    result = actionlint(*files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_does_flag_problems(tmp_path: Path) -> None:
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-24.04\n    steps:\n"
                   "      - run: echo ${{ github.nope }}\n")
    assert actionlint(bad).returncode != 0


def test_tests_run_on_pull_requests() -> None:
    ci = workflow("ci.yml")
    assert "pull_request" in ci["on"]
    assert any(step.get("run") == "bash .ci/run" for step in ci["jobs"]["test"]["steps"])


def test_images_are_built_and_pushed_on_tags() -> None:
    images = workflow("images.yml")
    assert images["on"] == {"push": {"tags": ["v*"]}}
    matrix = images["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert {m["dockerfile"] for m in matrix} == {"Dockerfile.api", "Dockerfile.trainer"}
    build = next(s for s in images["jobs"]["build"]["steps"]
                 if s.get("uses", "").startswith("docker/build-push-action"))
    assert build["with"]["push"] is True


def test_deploy_to_aks_is_manual_and_applies_the_overlay() -> None:
    deploy = workflow("deploy-aks.yml")
    assert list(deploy["on"]) == ["workflow_dispatch"]
    runs = " ".join(s.get("run", "") for s in deploy["jobs"]["deploy"]["steps"])
    assert "kubectl apply -k k8s/overlays/aks" in runs
    assert (ROOT / "k8s" / "overlays" / "aks" / "kustomization.yaml").is_file()
