"""A live job's warm standby, as the supervisor keeps it: run in this process with stand-in
pods and a stand-in standby (tests/api/backends/stand_ins.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from api.backends import programs
from api.backends.local.jobdir import (
    DeleteCommand,
    KillCommand,
    ScaleCommand,
    StandbyRecord,
    read_state,
    same_process,
    send_command,
)
from api.backends.local.standby_process import MAX_FAILURES, Standby
from api.backends.local.supervisor import Supervisor
from tests.api.backends.stand_ins import start_supervisor, ticks_until, took_part, up


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Supervisor]:
    running = start_supervisor(tmp_path, monkeypatch, standby=True, settle_seconds=0.0)
    yield running
    running.kill_leftovers()


def standby_of(supervisor: Supervisor) -> Standby:
    assert supervisor.standby is not None
    return supervisor.standby


def test_the_next_pod_to_start_is_the_standby(supervisor: Supervisor) -> None:
    standby, job_dir = standby_of(supervisor), supervisor.job_dir
    ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
    for _ in range(5):
        supervisor.tick()
    assert standby.process is None  # not while the pods have yet to take part

    took_part(supervisor)
    warm = ticks_until(supervisor, lambda: standby.ready and standby.process, "a loaded standby")
    record = read_state(job_dir).standby  # type: ignore[union-attr]
    assert record == StandbyRecord(pid=warm.pid, pid_started=warm.started, ready=True)

    pod = supervisor.pods[1]
    old = pod.process
    send_command(job_dir, KillCommand(ordinal=1, grace_seconds=5))
    supervisor.tick()  # the standby takes over in the tick of the kill, not once the pod left
    assert pod.process is warm and old is not None
    ticks_until(supervisor, lambda: pod.retiring is None and old.poll(),
                "the old process to leave")
    assert old.exit_code == 0  # SIGTERM: it left
    ticks_until(supervisor, lambda: up(supervisor), "the standby to run as pod 1")
    assert pod.restarts == 0 and pod.phase == "Running"
    log = job_dir.log(pod.name).read_text()
    assert f"standby {warm.pid} became {pod.name} incarnation {pod.incarnation}" in log
    assert read_state(job_dir).standby is None  # type: ignore[union-attr]

    for _ in range(5):
        supervisor.tick()
    assert standby.process is None  # not before the new pod took part
    took_part(supervisor)
    again = ticks_until(supervisor, lambda: standby.ready and standby.process, "a new standby")
    assert again.pid != warm.pid

    send_command(job_dir, ScaleCommand(replicas=3))  # a new ordinal is the standby too
    ticks_until(supervisor, lambda: len(supervisor.pods) == 3, "pod 2 to start")
    assert supervisor.pods[2].process is again


def test_the_standby_ends_with_the_job(supervisor: Supervisor) -> None:
    standby = standby_of(supervisor)
    took_part(supervisor)
    warm = ticks_until(supervisor, lambda: standby.ready and standby.process, "a loaded standby")
    send_command(supervisor.job_dir, DeleteCommand())
    ticks_until(supervisor, lambda: supervisor.finished, "the job to finish")
    assert warm.poll() and standby.process is None
    assert not list(supervisor.job_dir.ready_dir.glob("standby.*"))


def test_a_job_stops_keeping_a_standby_that_keeps_failing(
        supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(programs, "standby_argv",
                        lambda *args, **kwargs: [sys.executable, "-c", "raise SystemExit(2)"])
    standby = standby_of(supervisor)
    took_part(supervisor)
    ticks_until(supervisor, lambda: standby.failures == MAX_FAILURES and not standby.process,
                "the standbys to fail")
    for _ in range(10):
        supervisor.tick()
    assert standby.process is None and standby.failures == MAX_FAILURES
    pod = supervisor.pods[0]
    send_command(supervisor.job_dir, KillCommand(ordinal=0, grace_seconds=5))
    ticks_until(supervisor, lambda: pod.incarnation > 0 and up(supervisor),
                "pod 0 to be recreated without a standby")


def test_the_standby_a_dead_supervisor_left_is_discarded() -> None:
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              start_new_session=True)
    try:
        record = StandbyRecord(pid=orphan.pid, pid_started=psutil.Process(orphan.pid).create_time())
        assert same_process(record.pid, record.pid_started) is not None
        Standby.discard(record)  # what an adopting supervisor does with it
        assert orphan.wait(timeout=10) == -signal.SIGKILL
    finally:
        orphan.kill()
