"""The Supervisor: a job's pods and coordinator, watched one tick at a time and recorded in
state.json; each tick delegates to the module that owns that part of the job's life."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import psutil

from api.backends import programs
from api.backends.local import forking
from api.backends.local.jobdir import (
    JobDir,
    LaunchDocument,
    Mode,
    StateDocument,
    signal_group,
    write_state,
)
from api.backends.local.processes import POLL_SECONDS, STOP_GRACE_SECONDS, Pod, Watched, spawn
from api.backends.local.standby_process import SETTLE_SECONDS, Standby
from api.backends.local.supervisor import failures, migration
from api.backends.local.supervisor.adoption import adopt
from api.backends.local.supervisor.commands import run_commands
from api.backends.local.supervisor.coordinator import Coordinator
from api.backends.local.supervisor.environment import free_port, inherited_env
from api.backends.local.supervisor.keep_warm import keep_standby
from trainer.forkclient import ForkClient

logger = logging.getLogger(__name__)

EXIT_POLL_SECONDS = 0.02
"""How often the loop looks for a running pod's end between its ticks."""


class Supervisor:
    """One job's supervisor: the state it keeps, its loop and how it starts and stops pods."""

    def __init__(self, job_dir: JobDir, document: LaunchDocument,
                 previous: StateDocument | None = None,
                 settle_seconds: float = SETTLE_SECONDS) -> None:
        """`settle_seconds`: how long after the last pod started its standby may start."""
        self.job_dir, self.launch = job_dir, document.launch
        self.job_id = self.launch.job_id
        self.max_restarts, self.backoff = document.max_restarts, document.restart_backoff
        self.replicas = self.launch.pods
        """The pods asked for: the launch's, until the job is scaled."""
        self.issued = 0
        """The highest incarnation number started (StateDocument.issued)."""
        self.pods = [Pod(i, f"{self.job_id}-{i}") for i in range(self.replicas)]
        self.live = self.launch.fault_tolerance == "live"
        self.coordinator = Coordinator(job_dir, self.launch, self.start_process)
        self.started = psutil.Process().create_time()
        self.mode: Mode = "running"
        self.final_reason: str | None = None
        self.finished = False
        self.reason: str | None = None
        self.adoptions = 0
        self.previous = previous
        """The state a dead supervisor left, to adopt its processes from."""
        stages = self.launch.spec.stages
        self.stages = stages if self.live else 1
        """Pods per torchft replica group: a live pipeline's stages."""
        self.replica_ports = ([free_port() for _ in range(self.replicas // stages)]
                              if self.stages > 1 else [])
        """Where each replica of a live pipeline meets (its stage 0 hosts the store)."""
        # A standby is any pod's; a pipeline pod holds one stage and meets its replica first.
        self.standby = (Standby(job_dir, self.start_process, settle_seconds)
                        if self.live and document.standby and self.stages == 1 else None)
        """The warm process the next pod to start becomes (live jobs)."""
        self.warm_workers = document.standby
        """Whether restart-mode pods keep a warm worker for their next round."""
        self.fork_pods = document.fork_pods
        self.forks: ForkClient | None = None
        """Where pods and the standby start from, while it serves."""
        self._sigterm = False
        self._written: StateDocument | None = None

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.previous is not None:
            adopt(self, self.previous)
        self.write_state()
        try:
            if self.fork_pods:
                self.forks = forking.job_server(self.pod_env("", "", None), self.job_dir.path,
                                                self.job_dir.log(forking.NAME),
                                                programs.preloads(self.launch))
            self.ensure_coordinator()
            self.coordinator.wait_listening()
            for pod in self.pods:
                if pod.phase == "Pending" and self.mode == "running":
                    self.start_pod(pod, first=pod.started_at is None and self.previous is None)
            while not self.finished:
                self.rest()
                self.tick()
        finally:
            self.kill_leftovers()
        logger.info("finished (%s)", self.reason or "every pod succeeded")
        return 0

    def rest(self) -> None:
        """Wait for the next tick: POLL_SECONDS, or less when a running pod's process ends
        meanwhile (its death is dealt with at once: the lighthouse told, so the survivors'
        next quorum goes on, and the pod recreated: the standby, at once, takes part in it), or
        a migration's replacement can take over (the old process must be told before its step
        in flight ends)."""
        deadline = time.monotonic() + POLL_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            if any(pod.alive and pod.process is not None and pod.process.poll()
                   for pod in self.pods if pod.phase == "Running"):
                return
            if any(pod.surge is not None and migration.can_hand_over(self, pod)
                   for pod in self.pods):
                return
            time.sleep(min(left, EXIT_POLL_SECONDS))

    def tick(self) -> None:
        if self._sigterm:
            logger.info("SIGTERM: stopping like a delete")
            self._sigterm = False
            self.stop_group("finishing", "deleted")
        run_commands(self)
        failures.reap(self)
        migration.reap_extras(self)
        migration.promote_replacements(self)
        self.ensure_coordinator()
        if self.mode == "running":
            failures.check_group(self)
        elif all(process.poll() for pod in self.pods for process in pod.processes):
            self.finished, self.reason = True, self.final_reason
        keep_standby(self)
        self.write_state()

    def state(self) -> StateDocument:
        return StateDocument(
            supervisor_pid=os.getpid(), supervisor_started=self.started,
            finished=self.finished, reason=self.reason,
            pods=[pod.record() for pod in self.pods],
            coordinator=self.coordinator.record(),
            mode=self.mode, final_reason=self.final_reason, adoptions=self.adoptions,
            replicas=self.replicas, issued=self.issued, replica_ports=self.replica_ports,
            standby=self.standby.record() if self.standby else None)

    def write_state(self) -> None:
        """Write state.json when it changed since the last write."""
        state = self.state()
        if state != self._written:
            write_state(self.job_dir, state)
            self._written = state

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._sigterm = True  # acted on by the loop: a handler must not touch the pods' state

    def ensure_coordinator(self) -> None:
        """Start the job's lighthouse or store, or restart it on the same port if it ended."""
        if self.mode == "finishing" or self.coordinator.running():
            return
        self.coordinator.start()
        self.write_state()  # listed at once: should this supervisor die, it is found again

    def next_incarnation(self) -> int:
        self.issued += 1
        return self.issued

    def pod(self, ordinal: int) -> Pod | None:
        return next((pod for pod in self.pods if pod.ordinal == ordinal), None)

    def start_pod(self, pod: Pod, first: bool = False) -> None:
        """Start the pod's process: incarnation 0 at the job's launch, a new number after."""
        pod.incarnation = 0 if first else self.next_incarnation()
        pod.process = self.spawn_pod(pod, pod.incarnation)
        pod.phase, pod.started_at = "Running", time.time()
        pod.signalled_at, pod.replace_on_exit = None, False
        logger.info("pod %s started: pid %d, incarnation %d, restarts %d", pod.name,
                    pod.process.pid, pod.incarnation, pod.restarts)
        self.write_state()  # listed at once: should this supervisor die, it is found again

    def spawn_pod(self, pod: Pod, incarnation: int) -> Watched:
        """Start one process group of `pod` as its `incarnation`: the standby, if one runs."""
        ready = self.job_dir.ready(pod.name, incarnation)
        ready.unlink(missing_ok=True)
        env = self.pod_env(pod.name, str(incarnation), ready,
                           self.job_dir.replica(pod.name, incarnation), pod.ordinal)
        log = self.job_dir.log(pod.name)
        if self.standby is not None and (process := self.standby.take(env, log)) is not None:
            return process
        argv = programs.pod_argv(self.launch, self.coordinator.endpoint, programs.LOOPBACK,
                                 python=sys.executable, ends_told=True)  # failures.reap
        return self.start_process(argv, log, env)

    def start_process(self, argv: list[str], log: Path, env: dict[str, str],
                      stdin: bool = False) -> Watched:
        """Start a pod's or the standby's process group: forked where the fork server serves,
        else spawned. `stdin`: a pipe its `hand` writes to."""
        if self.forks is not None and (forked := forking.fork(
                self.forks, argv, env, self.job_dir.path, log, stdin)) is not None:
            return forked
        return spawn(argv, self.job_dir.path, log, env,
                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)

    def pod_env(self, name: str, incarnation: str, ready: Path | None,
                replica: Path | None = None, ordinal: int | None = None) -> dict[str, str]:
        """A pod's environment (the standby's: no name, incarnation or ready file)."""
        store = None
        if self.replica_ports and ordinal is not None:
            store = str(programs.Endpoint(programs.LOOPBACK,
                                          self.replica_ports[ordinal // self.stages]))
        # Fixed for the job (its pods as launched, whatever it is scaled to): a thread count
        # changes a CPU's floating-point sums, and every pod must compute a shard alike.
        threads = (os.cpu_count() or 1) // max(self.launch.pods, 1)
        inherited = inherited_env(store_credentials=not self.launch.store_env)
        return {**inherited, **programs.pod_env(self.launch, name, self.coordinator.endpoint,
                                                programs.LOOPBACK, threads,
                                                incarnation=incarnation, ready_file=ready,
                                                replica_file=replica, replica_store=store,
                                                warm_worker=self.warm_workers,
                                                fork_workers=self.fork_pods)}

    def stop_pod(self, pod: Pod, grace: float) -> None:
        """Stop every process group of the pod: its current one and any migration's."""
        self.signal_pod(pod, grace)
        for extra in (pod.surge, pod.retiring):
            if extra is not None:
                extra.process.stop(grace)

    def signal_pod(self, pod: Pod, grace: float) -> None:
        """SIGTERM its group now and SIGKILL it after `grace` seconds (at once for 0)."""
        if pod.process is None or not pod.alive:
            return
        pod.signalled_at = pod.signalled_at or time.time()
        pod.process.stop(grace)

    def stop_group(self, mode: Mode, reason: str | None) -> None:
        """Stop every live pod (SIGTERM, SIGKILL after the grace) and then finish."""
        if self.mode == "finishing":
            return  # the first reason to finish wins; the pods are already being stopped
        self.mode, self.final_reason = mode, reason
        for pod in self.pods:
            self.stop_pod(pod, STOP_GRACE_SECONDS)

    def kill_leftovers(self) -> None:
        """Never leave an orphan pod, standby or coordinator, whatever ended the loop."""
        if self.standby is not None:
            self.standby.stop()
        if self.forks is not None:
            self.forks.close()
        self.coordinator.kill()
        for pod in self.pods:
            for process in pod.processes:
                if not process.poll():
                    logger.warning("pod %s (pid %d) still running at exit: SIGKILL", pod.name,
                                   process.pid)
                    signal_group(process.pid, signal.SIGKILL)
                    process.wait(timeout=STOP_GRACE_SECONDS)
            if pod.process is not None and pod.phase == "Running":
                pod.exit_code, pod.phase = pod.process.exit_code, "Failed"
        if not self.finished:
            self.finished, self.reason = True, self.reason or "supervisor stopped unexpectedly"
        self.write_state()
