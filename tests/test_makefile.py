"""The Makefile's setup: where PyTorch comes from (read with `make -n`, nothing is installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib

import pytest

from tests.conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_commands(target: str, *variables: str, bytecode: bool = True) -> list[str]:
    """What `make <target>` would run from scratch (-B: whatever the stamps say), where Python
    writes the bytecode it compiles (`bytecode`) or where PYTHONDONTWRITEBYTECODE is set."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    result = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target, *variables],
                            capture_output=True, text=True, timeout=60, check=True, env=env)
    return result.stdout.splitlines()


def setup_commands(*variables: str, target: str = "setup") -> list[str]:
    """`make_commands`, whether pip compiles or not (see the next test)."""
    return [c.replace(" --no-compile", "") for c in make_commands(target, *variables)]


def test_pip_leaves_compiling_to_the_first_import_unless_python_writes_no_bytecode() -> None:
    """An install compiles every module it unpacks (40 s of the project's 90 s), most of
    which nothing imports; a first import compiles what it imports and caches it, unless
    PYTHONDONTWRITEBYTECODE is set: every process would then compile again."""
    def installs(commands: list[str]) -> list[str]:
        return [c for c in commands if " -m pip install" in c and "--upgrade pip" not in c]
    lazily = installs(make_commands("test-setup"))
    assert len(lazily) == 4  # the project, the offline assets, moto's and olah's environments
    assert all("--no-compile" in c for c in lazily)
    eagerly = installs(make_commands("test-setup", bytecode=False))
    assert len(eagerly) == 4 and not any("--no-compile" in c for c in eagerly)


def torch_pin() -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in dependencies if d.startswith("torch=="))


def test_torch_index_installs_the_pinned_torch_from_that_index_first() -> None:
    commands = setup_commands(f"TORCH_INDEX={CPU_INDEX}")
    torch = [i for i, c in enumerate(commands) if f"--index-url {CPU_INDEX}" in c]
    project = [i for i, c in enumerate(commands) if "install --quiet -e '.[dev]'" in c]
    assert len(torch) == 1 and len(project) == 1 and torch[0] < project[0]
    assert commands[torch[0]].endswith(f"pip install --quiet --index-url {CPU_INDEX} "
                                       f"'{torch_pin()}'")
    assert "index-url" not in commands[project[0]]  # everything else from PyPI, as ever


def test_by_default_torch_comes_from_pypi_with_the_rest() -> None:
    commands = setup_commands()
    assert not any("index-url" in c for c in commands)
    assert any("install --quiet -e '.[dev]'" in c for c in commands)


def test_the_test_servers_are_installed_for_the_tests_only_moto_in_its_own_venv() -> None:
    demo = setup_commands()
    assert not any("tests/stores" in c for c in demo)  # `make demo` needs no test server
    tests = setup_commands(target="test-setup")
    assert set(demo) <= set(tests)
    assert "cd tests/stores && npm ci --ignore-scripts --no-audit --no-fund" in tests
    moto = [c for c in tests if "tests/stores/requirements.txt" in c]
    assert moto == ["tests/stores/.venv/bin/python -m pip install --quiet -r "
                    "tests/stores/requirements.txt"]
    # Every package pinned, as in a lockfile; botocore's python-dateutil<3 stays over there.
    pins = [line for line in (ROOT / "tests/stores/requirements.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert all("==" in line for line in pins) and any(p.startswith("moto[server]==")
                                                        for p in pins)
