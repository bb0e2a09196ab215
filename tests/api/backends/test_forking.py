"""A job's fork server (trainer.forkserver) as the supervisor drives it
(api/backends/local/forking.py): real forks of a real server, watched as spawned pods are."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.backends.local.forking import Forked, fork
from tests.support import wait_for
from trainer.forkclient import ForkClient

PROBE = """
import json, os, sys
line = sys.stdin.readline() if "--read" in sys.argv else None
print(json.dumps({"argv": sys.argv[1:], "probe": os.environ.get("PROBE"), "cwd": os.getcwd(),
                  "leader": os.getsid(0) == os.getpid(), "forked": "torch" in sys.modules,
                  "line": line, "tokenizers": os.environ.get("TOKENIZERS_PARALLELISM")}),
      flush=True)
if "--sleep" in sys.argv:
    import time
    time.sleep(120)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("forking")
    (directory / "probe.py").write_text(PROBE)
    return directory


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[ForkClient]:
    """One server for the module: importing torch and transformers takes seconds."""
    forks = ForkClient.spawn({**os.environ, "TOKENIZERS_PARALLELISM": "true"}, workdir,
                             workdir / "forkserver.log")
    yield forks
    forks.close()
    assert forks.popen is not None and forks.popen.returncode == 0


def probe(server: ForkClient, workdir: Path, log: str, *args: str, stdin: bool = False,
          **env: str) -> Forked:
    forked = fork(server, [sys.executable, "-m", "probe", *args], {**os.environ, **env}, workdir,
                  workdir / log, stdin=stdin)
    assert forked is not None, (workdir / "forkserver.log").read_text()
    return forked


def ended(process: Forked) -> int | None:
    wait_for(process.poll, timeout=30, what=f"process {process.pid} to end")
    return process.exit_code


def said(log: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(log.read_text().splitlines()[-1])
    return result


def test_a_fork_runs_the_module_in_its_own_session_with_its_environment(
        server: ForkClient, workdir: Path) -> None:
    # Read again or later, so set in the child: the thread count, NCCL's options, and the
    # tokenizers' parallelism (transformers' pipelines set it in a running parent).
    process = probe(server, workdir, "a.log", "one", "two", PROBE="a", PROBE_EXIT="3",
                    OMP_NUM_THREADS="1", TORCH_NCCL_ASYNC_ERROR_HANDLING="3",
                    TOKENIZERS_PARALLELISM="false")
    assert ended(process) == 3
    assert said(workdir / "a.log") == {"argv": ["one", "two"], "probe": "a",
                                       "cwd": str(workdir), "leader": True, "forked": True,
                                       "line": None, "tokenizers": "false"}


def test_a_child_whose_libraries_would_read_another_environment_starts_afresh(
        server: ForkClient, workdir: Path) -> None:
    process = probe(server, workdir, "b.log", PROBE="b", HF_HOME=str(workdir / "elsewhere"),
                    TORCH_NCCL_ASYNC_ERROR_HANDLING="3")  # read only when NCCL starts
    assert ended(process) == 0
    assert said(workdir / "b.log") | {"cwd": None, "tokenizers": None} == {
        "argv": [], "probe": "b", "cwd": None, "leader": True, "forked": False, "line": None,
        "tokenizers": None}
    assert "since HF_HOME differ" in (workdir / "b.log").read_text()  # the name, no value


def test_a_fork_with_a_pipe_reads_what_it_is_handed(server: ForkClient, workdir: Path) -> None:
    process = probe(server, workdir, "c.log", "--read", stdin=True)
    assert process.hand("the assignment\n")
    assert ended(process) == 0
    assert said(workdir / "c.log")["line"] == "the assignment\n"


def test_a_killed_fork_says_the_signal(server: ForkClient, workdir: Path) -> None:
    process = probe(server, workdir, "d.log", "--sleep")
    wait_for(lambda: (workdir / "d.log").exists() and (workdir / "d.log").read_text(),
             timeout=30, what="the probe to start")
    os.killpg(process.pid, signal.SIGKILL)
    assert ended(process) == -signal.SIGKILL


def test_without_a_server_nothing_is_forked_and_its_children_are_still_watched(
        workdir: Path) -> None:
    forks = ForkClient.spawn(dict(os.environ), workdir, workdir / "second.log")
    process = probe(forks, workdir, "e.log", "--sleep")
    wait_for(lambda: (workdir / "e.log").exists() and (workdir / "e.log").read_text(),
             timeout=30, what="the probe to start")
    os.kill(forks.pid, signal.SIGKILL)  # its children run on: only the server is gone
    assert forks.fork([sys.executable, "-m", "probe"], dict(os.environ), workdir,
                      workdir / "f.log") is None  # the supervisor spawns instead
    assert forks.broken and not process.poll()
    os.killpg(process.pid, signal.SIGKILL)
    assert ended(process) is None  # seen to end by polling: its status went with the server
    forks.close()


def test_a_server_that_never_serves_forks_nothing(workdir: Path) -> None:
    dead = ForkClient.over(subprocess.Popen(
        [sys.executable, "-c", "pass"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    assert dead.fork([sys.executable, "-m", "probe"], dict(os.environ), workdir,
                     workdir / "g.log") is None
    dead.close()
