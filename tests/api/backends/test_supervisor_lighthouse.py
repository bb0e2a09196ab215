"""The supervisor tells a live job's real lighthouse that a pod died, so the survivors' next
quorum does not wait for its heartbeats to expire (stand-in pods: stand_ins.py)."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from torchft._torchft import LighthouseClient

from api.backends.local.jobdir import KillCommand, send_command
from api.backends.local.supervisor import loop
from tests.api.backends.stand_ins import start_supervisor, ticks_until, took_part, up
from tests.support import accepts, wait_for
from trainer.contract import credentials
from trainer.contract.spec import JobSpec


def test_a_pod_that_dies_is_reported_gone_to_the_lighthouse(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = start_supervisor(tmp_path, monkeypatch, standby=False, lighthouse=True)
    try:
        endpoint = supervisor.coordinator.endpoint
        wait_for(lambda: accepts(endpoint.port), what="the lighthouse to listen", timeout=30)
        ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
        pod = supervisor.pods[1]
        dead = supervisor.job_dir.replica(pod.name, pod.incarnation).read_text()
        client = LighthouseClient(f"http://{endpoint}", timedelta(seconds=10))
        client.heartbeat(dead)  # the lighthouse knows it: it would wait for it

        send_command(supervisor.job_dir, KillCommand(ordinal=1, grace_seconds=0))
        ticks_until(supervisor, lambda: pod.phase == "Failed", "pod 1 to be seen dead")
        assert not supervisor.job_dir.replica(pod.name, pod.incarnation).exists()
        with pytest.raises(RuntimeError, match="has left"):
            client.quorum(replica_id=dead, timeout=timedelta(seconds=5), address="x",
                          store_address="s", step=1, world_size=1)
        ticks_until(supervisor, lambda: pod.phase == "Running" and up(supervisor),
                    "pod 1 to be recreated")
        survivor = supervisor.pods[0]
        assert supervisor.job_dir.replica(survivor.name, survivor.incarnation).exists()
    finally:
        supervisor.kill_leftovers()


def test_a_pod_that_dies_while_a_standby_is_loaded_is_replaced_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's rest ends with the pod, the standby takes its place in the next tick, with
    no backoff, and the lighthouse hears that it is replaced (so the survivors' next quorum
    waits for the replacement)."""
    supervisor = start_supervisor(tmp_path, monkeypatch, standby=True, lighthouse=True,
                                  settle_seconds=0.0)
    # Neither a backoff nor a full rest would end within the test.
    supervisor.backoff = 3600.0
    try:
        wait_for(lambda: accepts(supervisor.coordinator.endpoint.port),
                 what="the lighthouse to listen", timeout=30)
        ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
        took_part(supervisor)
        standby = supervisor.standby
        assert standby is not None
        warm = ticks_until(supervisor, lambda: standby.ready and standby.process,
                           "a loaded standby")
        pod = supervisor.pods[1]
        dead = supervisor.job_dir.replica(pod.name, pod.incarnation).read_text()

        monkeypatch.setattr(loop, "POLL_SECONDS", 3600.0)
        send_command(supervisor.job_dir, KillCommand(ordinal=1, grace_seconds=0))
        supervisor.tick()  # the SIGKILL
        if pod.process is not warm:  # not yet seen dead
            supervisor.rest()
            supervisor.tick()
        assert pod.process is warm and pod.restarts == 1 and pod.phase == "Running"
        log = supervisor.job_dir.log("lighthouse")
        wait_for(lambda: f"replica {credentials.shown(dead)} left; its replacement has "
                         f"started" in log.read_text(), what="the lighthouse to be told")
    finally:
        supervisor.kill_leftovers()


def test_a_live_pipeline_replica_stops_whole_when_one_of_its_stage_pods_dies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its other stage may be waiting for it in the replica's next quorum, which would hold it
    for the quorum timeout: it is stopped at once, and both are recreated; the other replica's
    pods are left alone."""
    spec = JobSpec(replicas=2, parallelism="pipeline", pipeline_stages=2)
    supervisor = start_supervisor(tmp_path, monkeypatch, standby=False, spec=spec)
    try:
        ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
        pids = [pod.process.pid for pod in supervisor.pods if pod.process is not None]
        assert len(pids) == 4

        send_command(supervisor.job_dir, KillCommand(ordinal=3, grace_seconds=0))
        ticks_until(supervisor, lambda: [p.phase for p in supervisor.pods] == [
            "Running", "Running", "Failed", "Failed"], "replica 1's stage pods to stop")
        ticks_until(supervisor, lambda: all(p.phase == "Running" for p in supervisor.pods)
                    and up(supervisor), "replica 1 to be recreated")
        assert [pod.restarts for pod in supervisor.pods] == [0, 0, 1, 1]
        now = [pod.process.pid for pod in supervisor.pods if pod.process is not None]
        assert now[:2] == pids[:2] and not set(now[2:]) & set(pids)
    finally:
        supervisor.kill_leftovers()


def test_a_live_pipeline_replica_whose_stage_pods_die_together_is_recreated_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both stages dead before the supervisor looks: stopping the replica must not hide the
    second one's end from the reaping that recreates it."""
    spec = JobSpec(replicas=2, parallelism="pipeline", pipeline_stages=2)
    supervisor = start_supervisor(tmp_path, monkeypatch, standby=False, spec=spec)
    try:
        ticks_until(supervisor, lambda: up(supervisor), "the pods to be up")
        for pod in supervisor.pods[2:]:
            assert pod.process is not None
            os.killpg(pod.process.pid, signal.SIGKILL)
        for pod in supervisor.pods[2:]:  # both dead (not yet reaped) before the next tick
            assert pod.process is not None
            os.waitid(os.P_PID, pod.process.pid, os.WEXITED | os.WNOWAIT)
        ticks_until(supervisor, lambda: all(p.phase == "Running" for p in supervisor.pods)
                    and up(supervisor) and [p.restarts for p in supervisor.pods] == [0, 0, 1, 1],
                    "replica 1 to be recreated whole")
    finally:
        supervisor.kill_leftovers()
