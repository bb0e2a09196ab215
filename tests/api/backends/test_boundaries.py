"""The backends share only their common modules: neither package borrows the other's internals,
and within the local backend, the API's side (backend, watchdog) and the supervisor's share only
the job directory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[3] / "api" / "backends"
SHARED = {"api.backends.base", "api.backends.policy", "api.backends.programs"}


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
    modules = sorted((BACKENDS / package).rglob("*.py"))
    assert len(modules) > 2, f"api/backends/{package}/ holds no modules: moved?"
    return modules


@pytest.mark.parametrize(("package", "other"), [("kubernetes", "local"), ("local", "kubernetes")])
def test_a_backend_package_imports_nothing_of_the_other(package: str, other: str) -> None:
    for path in package_modules(package):
        borrowed = {m for m in imported(path) if m.startswith(f"api.backends.{other}")}
        assert not borrowed, f"{path.name} imports {borrowed}"


def test_the_shared_modules_import_no_backend() -> None:
    shared = {f"{module.rsplit('.', 1)[1]}.py" for module in SHARED}
    for name in shared:
        backends = {m for m in imported(BACKENDS / name)
                    if m.startswith(("api.backends.local", "api.backends.kubernetes"))}
        assert not backends, f"{name} imports {backends}"
    assert {p.name for p in BACKENDS.glob("*.py")} == {"__init__.py", *shared}


def test_the_local_backend_and_its_supervisor_share_only_the_job_directory() -> None:
    local = BACKENDS / "local"
    api_side = [local / "backend.py", local / "watchdog.py"]
    supervisor_side = [local / "processes.py", local / "standby_process.py",
                       local / "forking.py", *sorted((local / "supervisor").glob("*.py"))]
    assert len(supervisor_side) > 3, "api/backends/local/supervisor/ holds no modules: moved?"
    for path in api_side:
        borrowed = {m for m in imported(path) if m.startswith(("api.backends.local.supervisor",
                                                               "api.backends.local.processes",
                                                               "api.backends.local.standby_process",
                                                               "api.backends.local.forking"))}
        assert not borrowed, f"{path.name} imports {borrowed}"
        assert "api.backends.local.jobdir" in imported(path)
    for path in supervisor_side:
        assert not {m for m in imported(path) if m.startswith(("api.backends.local.backend",
                                                               "api.backends.local.watchdog"))}
    assert "api.backends.local.jobdir" in imported(local / "supervisor" / "loop.py")
