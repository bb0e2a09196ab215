"""Dockerfile.api and Dockerfile.trainer: hadolint-clean, pinned, non-root, multi-stage.

No Docker engine here: the images are linted and read, not built.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from api.backends.kubernetes.cluster import USER_ID
from tests.conftest import ROOT

HADOLINT = Path(sys.executable).with_name("hadolint")
DOCKERFILES = ["Dockerfile.api", "Dockerfile.trainer"]


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True,
                          text=True, timeout=60)


def stages(path: Path) -> list[list[str]]:
    """The instructions of each stage (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    result: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(line)
    return result


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name: str) -> None:
    result = hadolint(ROOT / name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_problems(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install gcc\nRUN pip install requests\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3013" in result.stdout


@pytest.mark.parametrize("name", DOCKERFILES)
def test_pinned_multi_stage_non_root(name: str) -> None:
    path = ROOT / name
    text = path.read_text()
    bases = re.findall(r"^ARG \w+_IMAGE=(\S+)$", text, re.MULTILINE)
    assert bases and all(f"${{{name}}}" in text for name in
                         re.findall(r"^ARG (\w+_IMAGE)=", text, re.MULTILINE))
    for base in bases:  # exact patch releases of slim Debian images (or digests), never moving
        assert re.fullmatch(r"(python|node):\d+\.\d+\.\d+-(bookworm-)?slim(-\w+)?"
                            r"(@sha256:[0-9a-f]{64})?", base), base
    build, *_, final = stages(path)
    assert build[0] == "FROM ${PYTHON_IMAGE} AS build" and final[0] == "FROM ${PYTHON_IMAGE}"
    assert f"USER {USER_ID}:{USER_ID}" in final  # the uid the manifests run as
    assert any(f"--uid {USER_ID}" in line for line in final)
    runs = [line for line in final if line.startswith("RUN ")]
    assert all("useradd" in line for line in runs)  # no package installs, no build tools
    assert any(line.startswith("COPY --from=build /opt/venv") for line in final)
    assert "torch==2.13.0" in text


def test_api_image_has_a_healthcheck_and_the_dashboard() -> None:
    final = stages(ROOT / "Dockerfile.api")[-1]
    # api/routes/web.py serves web/ next to api/ and uPlot from web/node_modules/uplot/dist.
    assert "COPY --from=web /web/node_modules/uplot/dist ./web/node_modules/uplot/dist" in final
    assert "WORKDIR /app" in final
    check = next(line for line in final if line.startswith("HEALTHCHECK"))
    assert "http://127.0.0.1:8000/healthz" in check
    # Every address of either family: an IPv6-only cluster reaches it too.
    assert any(line.startswith("CMD") and '"api"' in line and '"::"' in line
               for line in final)


def test_trainer_image_takes_the_torch_build_as_an_argument() -> None:
    build = stages(ROOT / "Dockerfile.trainer")[0]
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in build
    assert any('--index-url "$TORCH_INDEX" torch==2.13.0' in line for line in build)


def test_build_context_leaves_out_local_state() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "data", "runs", "tests"} <= ignored
