"""The local backend: one detached supervisor process per job, observed through its files.

Everything lives in `jobs_dir/<job_id>/` (see api/backends/local/jobdir.py). The supervisor runs
in its own session, so it outlives the API process; a new LocalBackend on the same jobs_dir
re-adopts it from these files alone. The watchdog (watchdog.py) starts the supervisors and,
in `reconcile`, replaces one that died while its job runs; `status` only reads.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path

from api.backends.base import (
    BackendError,
    Launch,
    Moving,
    PlacementError,
    PodStatus,
    StagingRequest,
    WorkloadConflict,
    WorkloadNotFound,
    WorkloadStatus,
)
from api.backends.local.initializers import Initializers
from api.backends.local.jobdir import (
    DEFAULT_BACKOFF_SECONDS,
    DEFAULT_MAX_RESTARTS,
    AnyCommand,
    JobDir,
    KillCommand,
    LaunchDocument,
    MigrateCommand,
    ScaleCommand,
    StateDocument,
    pending_commands,
    read_command,
    read_launch,
    read_state,
    same_process,
    send_command,
    tail_lines,
    write_launch,
)
from api.backends.local.template import Template
from api.backends.local.watchdog import DELETE_TIMEOUT, Watchdog

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
SUPERVISOR_RESTARTS = 3
"""How often a job's supervisor may die and be replaced before the job fails instead."""


class LocalBackend:
    name = "local"

    def __init__(self, jobs_dir: Path, max_restarts: int = DEFAULT_MAX_RESTARTS,
                 restart_backoff: float = DEFAULT_BACKOFF_SECONDS,
                 supervisor_restarts: int = SUPERVISOR_RESTARTS, standby: bool = True,
                 delete_timeout: float = DELETE_TIMEOUT, fork_pods: bool = True,
                 fork_template: Path | Template | None = None) -> None:
        """`fork_template`: a fork-server template (api.backends.local.template) that jobs'
        supervisors ask for their fork servers, by its socket, or one to close with this."""
        self.jobs_dir = jobs_dir
        self.max_restarts, self.restart_backoff = max_restarts, restart_backoff
        self.standby, self.fork_pods = standby, fork_pods
        self._template = fork_template if isinstance(fork_template, Template) else None
        socket = fork_template.socket if isinstance(fork_template, Template) else fork_template
        self._watchdog = Watchdog(supervisor_restarts, delete_timeout,
                                  socket if fork_pods else None)
        self._initializers = Initializers()

    def close(self) -> None:
        """Stop its template (the jobs' supervisors and pods run on)."""
        if self._template is not None:
            self._template.close()

    def launch(self, launch: Launch) -> None:
        job_dir = self._job_dir(launch.job_id)
        if job_dir.path.is_dir() and self._watchdog.alive(launch.job_id, job_dir,
                                                          read_state(job_dir)):
            raise BackendError(f"job {launch.job_id} already has a running supervisor")
        for sub in (job_dir.logs, job_dir.commands):
            sub.mkdir(parents=True, exist_ok=True)
        # A previous run's state and commands must not be mistaken for the new supervisor's.
        job_dir.state.unlink(missing_ok=True)
        for stale in job_dir.commands.iterdir():
            stale.unlink(missing_ok=True)
        write_launch(job_dir, LaunchDocument(launch, self.max_restarts, self.restart_backoff,
                                             self.standby, self.fork_pods))
        child = self._watchdog.launch(job_dir)
        logger.info("job %s: supervisor started (pid %d)", launch.job_id, child.pid)

    def reconcile(self, job_id: str) -> None:
        """Replace the job's supervisor if it died with the job unfinished (or finish the job
        where it cannot be replaced)."""
        job_dir = self._job_dir(job_id)
        if job_dir.path.is_dir():
            self._watchdog.tend(job_id, job_dir)

    def status(self, job_id: str) -> WorkloadStatus:
        job_dir = self._job_dir(job_id)
        if not job_dir.path.is_dir():
            return WorkloadStatus(present=False)
        state = read_state(job_dir)
        alive = self._watchdog.alive(job_id, job_dir, state)
        if state is None:
            return WorkloadStatus(present=alive, pods=[
                PodStatus(i, f"{job_id}-{i}", "Pending", 0)
                for i in sorted(self._ordinals(job_dir, state))])
        pods = [PodStatus(ordinal=p.ordinal, name=p.name, phase=p.phase, restarts=p.restarts,
                          started_at=p.started_at, exit_code=p.exit_code,
                          incarnation=str(p.incarnation),
                          migrating=p.migrating)
                for p in state.pods]
        return WorkloadStatus(present=alive and not state.finished, pods=pods,
                              finished=state.finished, reason=state.reason)

    def kill_pod(self, job_id: str, ordinal: int, grace_seconds: float) -> None:
        job_dir, _ = self._running_pod(job_id, ordinal)
        send_command(job_dir, KillCommand(ordinal=ordinal,
                                          grace_seconds=max(0.0, float(grace_seconds))))
        logger.info("job %s: kill of pod %d requested (grace %.1f s)", job_id, ordinal,
                    grace_seconds)

    def scale(self, job_id: str, replicas: int) -> None:
        job_dir, _ = self._running(job_id)
        send_command(job_dir, ScaleCommand(replicas=replicas))
        logger.info("job %s: scale to %d pods requested", job_id, replicas)

    def migrate_pod(self, job_id: str, ordinal: int, node: str | None) -> Moving:
        if node is not None:
            raise PlacementError("the local backend runs every pod on this machine: it has no "
                                 "other node to move a pod to (leave out `node`)")
        job_dir, state = self._running_pod(job_id, ordinal)
        pod = next((p for p in state.pods if p.ordinal == ordinal), None) if state else None
        queued = any(isinstance(command, MigrateCommand) and command.ordinal == ordinal
                     for command in self._queued(job_dir))
        if queued or (pod is not None and pod.migrating):
            raise WorkloadConflict(f"pod {job_id}-{ordinal} is already migrating")
        send_command(job_dir, MigrateCommand(ordinal=ordinal))
        logger.info("job %s: migration of pod %d requested", job_id, ordinal)
        return Moving(str(pod.incarnation) if pod else None)

    def _running(self, job_id: str) -> tuple[JobDir, StateDocument | None]:
        """The job's directory and state, where a supervisor runs it."""
        job_dir = self._job_dir(job_id)
        if not job_dir.path.is_dir():
            raise WorkloadNotFound(f"no job {job_id}")
        state = read_state(job_dir)
        if not self._watchdog.alive(job_id, job_dir, state) or (state and state.finished):
            raise WorkloadNotFound(f"job {job_id} has no running supervisor")
        return job_dir, state

    def _running_pod(self, job_id: str, ordinal: int) -> tuple[JobDir, StateDocument | None]:
        job_dir, state = self._running(job_id)
        ordinals = self._ordinals(job_dir, state)
        if ordinal not in ordinals:
            raise WorkloadNotFound(f"job {job_id} has no pod {ordinal} (pods: "
                                   f"{', '.join(map(str, sorted(ordinals))) or 'none'})")
        return job_dir, state

    @staticmethod
    def _queued(job_dir: JobDir) -> list[AnyCommand]:
        """The commands its supervisor has not run yet."""
        queued: list[AnyCommand] = []
        for path in pending_commands(job_dir):
            with contextlib.suppress(BackendError):  # run (and removed) meanwhile
                queued.append(read_command(path))
        return queued

    def delete(self, job_id: str) -> None:
        job_dir = self._job_dir(job_id)
        if not job_dir.path.is_dir():
            return
        self._watchdog.stop(job_id, job_dir)
        for command in job_dir.commands.glob("*"):
            command.unlink(missing_ok=True)  # nobody is left to obey them

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        job_dir = self._job_dir(job_id)
        return tail_lines(job_dir.log(f"{job_id}-{int(ordinal)}"), lines)

    def active_jobs(self) -> list[str]:
        if not self.jobs_dir.is_dir():
            return []
        active = []
        for path in sorted(self.jobs_dir.iterdir()):
            if not (JOB_ID.fullmatch(path.name) and path.is_dir()):
                continue
            job_dir = JobDir(path)
            try:
                state = read_state(job_dir)
            except BackendError as exc:
                logger.warning("job %s: %s", path.name, exc)
                continue
            if self._watchdog.alive(path.name, job_dir, state) and not (state and state.finished):
                active.append(path.name)
        return active

    def stage(self, request: StagingRequest) -> None:
        self._initializers.start(request)

    def staging(self, staging_id: str) -> bool:
        return self._initializers.running(staging_id)

    def gone(self, job_id: str) -> bool:
        job_dir = self._job_dir(job_id)
        if not job_dir.path.is_dir():
            return True
        state = self._watchdog.readable_state(job_id, job_dir)
        listed = state.listed_processes() if state is not None else []
        return not self._watchdog.alive(job_id, job_dir, state) and not any(
            same_process(pid, started) is not None for _, pid, started in listed)

    def _job_dir(self, job_id: str) -> JobDir:
        # Job ids become path components: anything but [a-z0-9-] could escape jobs_dir.
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise WorkloadNotFound(f"invalid job id {job_id!r}")
        return JobDir(self.jobs_dir / job_id)

    @staticmethod
    def _ordinals(job_dir: JobDir, state: StateDocument | None) -> set[int]:
        """The pods the job has: as its state lists them (less those being scaled away), else
        as launched."""
        if state is not None:
            return {pod.ordinal for pod in state.pods if not pod.removing}
        document = read_launch(job_dir)
        return set(range(document.launch.pods if document else 0))
