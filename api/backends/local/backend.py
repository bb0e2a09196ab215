"""The local backend: one detached supervisor process per job, observed through its files.

Everything lives in `jobs_dir/<job_id>/` (see api/backends/local/jobdir.py). The supervisor runs
in its own session, so it outlives the API process; a new LocalBackend on the same jobs_dir
re-adopts it from these files alone. A supervisor that dies while its job runs (SIGKILL, the OOM
killer) is replaced, as a kubelet is restarted, by one that adopts the pods still running; where
that cannot be done, every process its state lists is killed and the job finishes, with the
reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from api.backends.base import (
    BackendError,
    Launch,
    Moving,
    PlacementError,
    PodStatus,
    WorkloadConflict,
    WorkloadNotFound,
    WorkloadStatus,
)
from api.backends.local.jobdir import (
    DEFAULT_BACKOFF_SECONDS,
    DEFAULT_MAX_RESTARTS,
    AnyCommand,
    DeleteCommand,
    JobDir,
    KillCommand,
    LaunchDocument,
    MigrateCommand,
    ScaleCommand,
    StateDocument,
    UnreadableDocument,
    pending_commands,
    read_command,
    read_launch,
    read_state,
    same_process,
    send_command,
    signal_group,
    tail_lines,
    try_lock,
    write_launch,
    write_state,
)
from trainer.contract.process import PRIVATE_UMASK

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
DELETE_TIMEOUT = 20.0
POLL_SECONDS = 0.1
STARTUP_GRACE = 30.0
"""How long a job with launch.json but no state.json yet counts as starting up."""
SUPERVISOR_RESTARTS = 3
"""How often a job's supervisor may die and be replaced before the job fails instead."""
KILL_TIMEOUT = 10.0
"""How long a SIGKILLed process may take to be gone."""
# The package root, so the supervisor imports this checkout even where it is not installed.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


class LocalBackend:
    name = "local"

    def __init__(self, jobs_dir: Path, max_restarts: int = DEFAULT_MAX_RESTARTS,
                 restart_backoff: float = DEFAULT_BACKOFF_SECONDS,
                 supervisor_restarts: int = SUPERVISOR_RESTARTS, standby: bool = True) -> None:
        self.jobs_dir = jobs_dir
        self.max_restarts, self.restart_backoff = max_restarts, restart_backoff
        self.standby = standby
        self.supervisor_restarts = supervisor_restarts
        # Supervisors this process started; polling them reaps them (no zombies in the API).
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()  # routes and the reconciler call in from several threads
        self._revivals: dict[str, int] = {}
        """Supervisors started per job to adopt one that died (some may have died at once)."""
        self._seen: dict[str, StateDocument] = {}
        """The last readable state of each unfinished job: what to stop should it turn
        unreadable."""
        self._deleting: set[str] = set()

    def launch(self, launch: Launch) -> None:
        job_dir = self._job_dir(launch.job_id)
        if job_dir.path.is_dir() and self._alive(launch.job_id, job_dir, read_state(job_dir)):
            raise BackendError(f"job {launch.job_id} already has a running supervisor")
        for sub in (job_dir.logs, job_dir.commands):
            sub.mkdir(parents=True, exist_ok=True)
        # A previous run's state and commands must not be mistaken for the new supervisor's.
        job_dir.state.unlink(missing_ok=True)
        for stale in job_dir.commands.iterdir():
            stale.unlink(missing_ok=True)
        write_launch(job_dir, LaunchDocument(launch, self.max_restarts, self.restart_backoff,
                                             self.standby))
        with self._lock:
            self._revivals.pop(launch.job_id, None)
            self._seen.pop(launch.job_id, None)
            try:
                child = self._start_supervisor(job_dir, adopt=False)
            except BackendError:
                job_dir.launch.unlink(missing_ok=True)
                raise
        logger.info("job %s: supervisor started (pid %d)", launch.job_id, child.pid)

    def status(self, job_id: str) -> WorkloadStatus:
        job_dir = self._job_dir(job_id)
        if not job_dir.path.is_dir():
            return WorkloadStatus(present=False)
        state, alive = self._observe(job_id, job_dir)
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
        if not self._alive(job_id, job_dir, state) or (state and state.finished):
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
        with self._lock:
            self._deleting.add(job_id)  # no dead supervisor of it is replaced meanwhile
        try:
            self._delete(job_id, job_dir)
        finally:
            with self._lock:
                self._deleting.discard(job_id)
                self._seen.pop(job_id, None)
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
            if self._alive(path.name, job_dir, state) and not (state and state.finished):
                active.append(path.name)
        return active

    def gone(self, job_id: str) -> bool:
        job_dir = self._job_dir(job_id)
        if not job_dir.path.is_dir():
            return True
        state = self._readable_state(job_id, job_dir)
        listed = state.listed_processes() if state is not None else []
        return not self._alive(job_id, job_dir, state) and not any(
            same_process(pid, started) is not None for _, pid, started in listed)

    def _job_dir(self, job_id: str) -> JobDir:
        # Job ids become path components: anything but [a-z0-9-] could escape jobs_dir.
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise WorkloadNotFound(f"invalid job id {job_id!r}")
        return JobDir(self.jobs_dir / job_id)

    def _start_supervisor(self, job_dir: JobDir, adopt: bool) -> subprocess.Popen[bytes]:
        """Start the job's supervisor (the caller holds self._lock)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")]))}
        argv = [sys.executable, "-m", "api.backends.local.supervisor", str(job_dir.path)]
        try:
            with job_dir.supervisor_log.open("ab") as log:
                child = subprocess.Popen(
                    [*argv, "--adopt"] if adopt else argv, cwd=job_dir.path, env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, umask=PRIVATE_UMASK)
        except OSError as exc:
            raise BackendError(f"cannot start the supervisor of {job_dir.job_id}: {exc}") \
                from None
        self._children[job_dir.job_id] = child
        return child

    @staticmethod
    def _ordinals(job_dir: JobDir, state: StateDocument | None) -> set[int]:
        """The pods the job has: as its state lists them (less those being scaled away), else
        as launched."""
        if state is not None:
            return {pod.ordinal for pod in state.pods if not pod.removing}
        document = read_launch(job_dir)
        return set(range(document.launch.replicas if document else 0))

    def _observe(self, job_id: str, job_dir: JobDir) -> tuple[StateDocument | None, bool]:
        """The job's state, after replacing its supervisor if that died with the job unfinished;
        and whether a supervisor runs it."""
        try:
            state = read_state(job_dir)
        except UnreadableDocument as exc:
            final = None if self._supervised(job_id) else self._give_up(
                job_id, job_dir, self._seen.get(job_id),
                f"the job's supervisor died and its state is unreadable ({exc}); every pod it "
                "last listed was stopped")
            if final is None:
                raise
            return final, False
        if state is None or state.finished:
            self._seen.pop(job_id, None)
            return state, self._alive(job_id, job_dir, state)
        self._seen[job_id] = state
        if self._alive(job_id, job_dir, state):
            return state, True
        state = self._revive(job_id, job_dir, state)
        return state, self._alive(job_id, job_dir, state)

    def _revive(self, job_id: str, job_dir: JobDir, state: StateDocument) -> StateDocument:
        """Start a supervisor that adopts the pods of the dead one; where none can be, kill them
        and finish the job."""
        with self._lock:
            if job_id in self._deleting:
                return state
            tries = max(state.adoptions, self._revivals.get(job_id, 0))
            self._revivals[job_id] = tries + 1
            if tries >= self.supervisor_restarts:
                reason = (f"the job's supervisor (pid {state.supervisor_pid}) died and is not "
                          f"replaced again: replaced {tries} times already (the most allowed); "
                          "every pod was stopped")
            else:
                try:
                    if read_launch(job_dir) is None:
                        raise UnreadableDocument(f"no {job_dir.launch.name}")
                    child = self._start_supervisor(job_dir, adopt=True)
                except BackendError as exc:
                    reason = (f"the job's supervisor (pid {state.supervisor_pid}) died and "
                              f"cannot be replaced ({exc}); every pod was stopped")
                else:
                    logger.warning("job %s: supervisor pid %s died; pid %d adopts its pods",
                                   job_id, state.supervisor_pid, child.pid)
                    return state
        return self._give_up(job_id, job_dir, state, reason) or state

    def _give_up(self, job_id: str, job_dir: JobDir, state: StateDocument | None,
                 reason: str) -> StateDocument | None:
        """Kill every process the job's state lists, then record the job finished for `reason`.

        Holding the supervisor's lock makes this the only writer of state.json, as a supervisor
        is. Where a supervisor holds it, that one is alive after all: None, and nothing done.
        """
        lock = try_lock(job_dir)
        if lock is None:
            return None
        try:
            if state is None:
                logger.warning("job %s: no state of it was ever read here: its pods, if any "
                               "run, are unknown", job_id)
                state = StateDocument(supervisor_pid=None, supervisor_started=None, pods=[])
            self._kill_listed(job_id, state)
            final = state.model_copy(update={
                "finished": True, "reason": reason, "mode": "finishing", "final_reason": reason,
                "pods": [p.model_copy(update={"phase": "Failed"}) if p.phase == "Running"
                         else p for p in state.pods]})
            write_state(job_dir, final)
        finally:
            os.close(lock)
        if reason != "deleted":
            logger.error("job %s: %s", job_id, reason)
        return final

    def _delete(self, job_id: str, job_dir: JobDir) -> None:
        state = self._readable_state(job_id, job_dir)
        if self._alive(job_id, job_dir, state):
            send_command(job_dir, DeleteCommand())
            deadline = time.monotonic() + DELETE_TIMEOUT
            while (self._alive(job_id, job_dir, state := self._readable_state(job_id, job_dir))
                   and time.monotonic() < deadline):
                time.sleep(POLL_SECONDS)
        supervisor = self._running_supervisor(job_id, state)
        if supervisor is not None:
            # It hung: it goes first, or it would restart the pods killed below.
            logger.warning("job %s: supervisor did not stop in %.0f s: SIGKILL", job_id,
                           DELETE_TIMEOUT)
            supervisor.send_signal(signal.SIGKILL)
            with contextlib.suppress(psutil.Error):  # a zombie of another parent never "ends"
                supervisor.wait(timeout=DELETE_TIMEOUT)
            state = self._readable_state(job_id, job_dir)  # it may have started pods meanwhile
        if state is None or (not state.finished
                             and self._give_up(job_id, job_dir, state, "deleted")):
            return
        self._kill_listed(job_id, state)

    def _readable_state(self, job_id: str, job_dir: JobDir) -> StateDocument | None:
        """state.json, or the last readable version of it."""
        try:
            return read_state(job_dir)
        except UnreadableDocument:
            return self._seen.get(job_id)

    def _alive(self, job_id: str, job_dir: JobDir, state: StateDocument | None) -> bool:
        """Whether the job's supervisor process runs (it may have finished and not exited yet)."""
        exited, running = self._reap_children()
        if job_id in running:
            return True
        if state is not None:
            # The lock also covers a clock step (that moves create times) and a supervisor that
            # another process started and that has not written its state yet.
            return (same_process(state.supervisor_pid, state.supervisor_started) is not None
                    or self._lock_held(job_dir))
        if job_id in exited:
            return False  # it died before writing any state
        # Launched by another API process that has not written its first state yet.
        launch_file = job_dir.launch
        return launch_file.is_file() and time.time() - launch_file.stat().st_mtime < STARTUP_GRACE

    @staticmethod
    def _lock_held(job_dir: JobDir) -> bool:
        lock = try_lock(job_dir)
        if lock is None:
            return True
        os.close(lock)
        return False

    def _running_supervisor(self, job_id: str,
                            state: StateDocument | None) -> psutil.Process | None:
        """The job's supervisor where it runs: the one state.json names, else one that this
        process started and that has not written its state yet."""
        if state is not None and (found := same_process(state.supervisor_pid,
                                                         state.supervisor_started)):
            return found
        with self._lock:
            child = self._children.get(job_id)
        if child is None or child.poll() is not None:
            return None
        with contextlib.suppress(psutil.Error):
            return psutil.Process(child.pid)
        return None

    def _supervised(self, job_id: str) -> bool:
        """Whether a supervisor this process started for the job still runs."""
        return job_id in self._reap_children()[1]

    def _reap_children(self) -> tuple[set[str], set[str]]:
        """Poll the supervisors this process started, so none stays a zombie: (exited, running)."""
        with self._lock:
            exited = {job_id for job_id, child in self._children.items()
                      if child.poll() is not None}
            for job_id in exited:
                del self._children[job_id]
            return exited, set(self._children)

    @staticmethod
    def _kill_listed(job_id: str, state: StateDocument) -> None:
        """SIGKILL each pod group and coordinator of `state` that is still that process, and
        wait until they are gone."""
        killed = []
        for what, pid, started in state.listed_processes():
            if same_process(pid, started) is not None:
                logger.warning("job %s: %s left behind: SIGKILL", job_id, what)
                signal_group(pid, signal.SIGKILL)
                killed.append((what, pid, started))
        deadline = time.monotonic() + KILL_TIMEOUT
        while left := [what for what, pid, started in killed if same_process(pid, started)]:
            if time.monotonic() > deadline:
                raise BackendError(f"job {job_id}: {', '.join(left)} outlived SIGKILL")
            time.sleep(POLL_SECONDS / 10)
