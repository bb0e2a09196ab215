"""The backends share only their common modules: neither package borrows the other's internals,
and within the local backend, the API's side and the supervisor's share only the job directory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[3] / "api" / "backends"
SHARED = {"api.backends.base", "api.backends.programs"}


def imported(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def package_modules(package: str) -> list[Path]:
    modules = sorted((BACKENDS / package).glob("*.py"))
    assert len(modules) > 2, f"api/backends/{package}/ holds no modules: moved?"
    return modules


@pytest.mark.parametrize(("package", "other"), [("kubernetes", "local"), ("local", "kubernetes")])
def test_a_backend_package_imports_nothing_of_the_other(package: str, other: str) -> None:
    for path in package_modules(package):
        borrowed = {m for m in imported(path) if m.startswith(f"api.backends.{other}")}
        assert not borrowed, f"{path.name} imports {borrowed}"


def test_the_shared_modules_import_no_backend() -> None:
    for name in ("base.py", "programs.py"):
        backends = {m for m in imported(BACKENDS / name)
                    if m.startswith(("api.backends.local", "api.backends.kubernetes"))}
        assert not backends, f"{name} imports {backends}"
    assert {p.name for p in BACKENDS.glob("*.py")} == {"__init__.py", "base.py", "programs.py"}


def test_the_local_backend_and_its_supervisor_share_only_the_job_directory() -> None:
    supervisor_side = {"api.backends.local.supervisor", "api.backends.local.processes",
                       "api.backends.local.standby"}
    assert not imported(BACKENDS / "local" / "backend.py") & supervisor_side
    for name in ("supervisor.py", "processes.py", "standby.py"):
        assert "api.backends.local.backend" not in imported(BACKENDS / "local" / name)
    assert "api.backends.local.jobdir" in imported(BACKENDS / "local" / "backend.py")
    assert "api.backends.local.jobdir" in imported(BACKENDS / "local" / "supervisor.py")
