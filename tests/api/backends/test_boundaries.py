"""The backends share only their common modules: neither borrows the other's internals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[3] / "api" / "backends"
LOCAL_ONLY = {"api.backends.local", "api.backends.local_jobdir", "api.backends.supervisor",
              "api.backends.supervised"}


def imported(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


@pytest.mark.parametrize("name", sorted(
    p.name for p in BACKENDS.glob("*.py") if p.name.startswith(("k8s", "kubernetes"))))
def test_the_kubernetes_backend_imports_nothing_of_the_local_one(name: str) -> None:
    assert not imported(BACKENDS / name) & LOCAL_ONLY


def test_the_local_backend_and_its_supervisor_share_only_the_job_directory() -> None:
    supervisor_side = {"api.backends.supervisor", "api.backends.supervised"}
    assert not imported(BACKENDS / "local.py") & supervisor_side
    for name in ("supervisor.py", "supervised.py"):
        assert "api.backends.local" not in imported(BACKENDS / name)
    assert "api.backends.local_jobdir" in imported(BACKENDS / "local.py")
    assert "api.backends.local_jobdir" in imported(BACKENDS / "supervisor.py")
