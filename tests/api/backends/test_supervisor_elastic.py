"""The supervisor's scale and migrate commands, run in this process with stand-in pods
(tests/api/backends/stand_ins.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from api.backends.local.jobdir import (
    MigrateCommand,
    ScaleCommand,
    read_state,
    send_command,
    signal_group,
)
from api.backends.local.supervisor import Supervisor
from tests.api.backends.stand_ins import start_supervisor, ticks_until, took_part, up


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Supervisor]:
    running = start_supervisor(tmp_path, monkeypatch, standby=False)
    yield running
    running.kill_leftovers()


def test_scale_down_and_up_never_repeats_an_incarnation(supervisor: Supervisor) -> None:
    job_dir = supervisor.job_dir
    send_command(job_dir, ScaleCommand(replicas=3))
    ticks_until(supervisor, lambda: len(supervisor.pods) == 3, "pod 2 to start")
    ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
    first = supervisor.pods[2].incarnation
    assert first > 0  # a pod added later takes a number no pod of the job had at launch

    leaving = supervisor.pods[2].process
    send_command(job_dir, ScaleCommand(replicas=1))
    ticks_until(supervisor, lambda: [p.ordinal for p in supervisor.pods] == [0],
                "pods 1 and 2 to leave and be dropped")
    assert leaving is not None and leaving.exit_code == 0  # asked to leave: SIGTERM, not KILL
    state = read_state(job_dir)
    assert state is not None and state.replicas == 1 and len(state.pods) == 1

    send_command(job_dir, ScaleCommand(replicas=3))
    ticks_until(supervisor, lambda: len(supervisor.pods) == 3, "pods 1 and 2 to start again")
    assert supervisor.pods[2].incarnation > first
    incarnations = [p.incarnation for p in supervisor.pods]
    assert len(set(incarnations[1:])) == 2 and all(p.restarts == 0 for p in supervisor.pods)
    assert all(p.phase == "Running" for p in supervisor.pods)


def test_a_migration_keeps_the_old_process_until_the_replacement_takes_part(
        supervisor: Supervisor) -> None:
    """No other pod has taken part (none holds the live state): make before break."""
    job_dir, pod = supervisor.job_dir, supervisor.pods[1]
    ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
    old, old_incarnation = pod.process, pod.incarnation
    send_command(job_dir, MigrateCommand(ordinal=1))
    surge = ticks_until(supervisor, lambda: pod.surge, "the replacement to start")
    ticks_until(supervisor, lambda: up(supervisor), "the replacement to be up")
    send_command(job_dir, MigrateCommand(ordinal=1))  # already migrating: ignored
    for _ in range(5):
        supervisor.tick()
    record = read_state(job_dir).pods[1]  # type: ignore[union-attr]
    assert record.surge is not None and record.surge.incarnation == surge.incarnation
    assert old is not None and not old.poll() and pod.process is old  # make before break

    job_dir.ready(pod.name, surge.incarnation).parent.mkdir(exist_ok=True)
    job_dir.ready(pod.name, surge.incarnation).touch()  # what the trainer does once it participates
    ticks_until(supervisor, lambda: pod.retiring is None and old.poll(),
                "the old incarnation to leave")
    assert old.exit_code == 0
    assert (pod.process, pod.incarnation) == (surge.process, surge.incarnation)
    assert pod.incarnation > old_incarnation and pod.restarts == 0 and pod.phase == "Running"
    assert supervisor.pods[0].surge is None


def test_a_replacement_in_the_lighthouse_takes_over_from_the_old_process_at_once(
        supervisor: Supervisor) -> None:
    """Another pod holds the live state: the old process is told to leave as soon as its
    replacement has joined the lighthouse, before the replacement took part in a step."""
    job_dir, pod = supervisor.job_dir, supervisor.pods[1]
    ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
    took_part(supervisor)
    old = pod.process
    send_command(job_dir, MigrateCommand(ordinal=1))
    surge = ticks_until(supervisor, lambda: pod.surge, "the replacement to start")
    ticks_until(supervisor, lambda: pod.retiring is None and old is not None and old.poll(),
                "the old incarnation to leave")
    assert old is not None and old.exit_code == 0  # SIGTERM: it left, it did not fail
    assert job_dir.replica(pod.name, surge.incarnation).exists()  # in the lighthouse
    assert not job_dir.ready(pod.name, surge.incarnation).exists()  # yet to take part
    assert (pod.process, pod.incarnation) == (surge.process, surge.incarnation)
    assert pod.phase == "Running" and pod.restarts == 0 and pod.surge is None


def test_two_pods_migrating_at_once_never_both_leave_before_a_replacement_took_part(
        supervisor: Supervisor) -> None:
    """The pod whose replacement reaches the lighthouse first hands over: that replacement
    heals from the other pod's old process, so the other waits for it to take part (make
    before break)."""
    job_dir, pods = supervisor.job_dir, supervisor.pods
    ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
    took_part(supervisor)
    old = [pod.process for pod in pods]
    send_command(job_dir, MigrateCommand(ordinal=0))
    send_command(job_dir, MigrateCommand(ordinal=1))
    # Which replacement writes its replica file first is the stand-ins' race, as the trainers'.
    def handed_over() -> list[int]:
        return [i for i, pod in enumerate(pods) if pod.surge is None and pod.process is not old[i]]

    ticks_until(supervisor, lambda: len(handed_over()) == 1 and up(supervisor),
                "one pod to hand over")
    moved = handed_over()[0]
    waiting, waiting_old = pods[1 - moved], old[1 - moved]
    for _ in range(10):
        supervisor.tick()
    assert pods[moved].process is not old[moved] and waiting.surge is not None
    assert waiting.process is waiting_old and waiting_old is not None and not waiting_old.poll()
    took_part(supervisor)  # the first replacement took part: the other pod may go
    ticks_until(supervisor, lambda: waiting.surge is None and waiting_old.poll(),
                "the other pod's old process to leave")


def test_a_replacement_that_dies_before_taking_part_leaves_the_pod_as_it_was(
        supervisor: Supervisor) -> None:
    pod = supervisor.pods[0]
    old = pod.process
    send_command(supervisor.job_dir, MigrateCommand(ordinal=0))
    surge = ticks_until(supervisor, lambda: pod.surge, "the replacement to start")
    signal_group(surge.process.pid, 9)
    ticks_until(supervisor, lambda: pod.surge is None, "the failed replacement to be dropped")
    assert pod.process is old and old is not None and not old.poll()
    assert pod.phase == "Running" and pod.restarts == 0
