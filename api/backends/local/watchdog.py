"""The supervisors' watchdog: it starts each job's supervisor, tells whether it runs, replaces
one that died with the job unfinished (as a kubelet is restarted) by one that adopts the pods
still running, and where that cannot be done, kills every process its state lists and finishes
the job with the reason."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from api.backends import programs
from api.backends.base import BackendError
from api.backends.local.jobdir import (
    DeleteCommand,
    JobDir,
    StateDocument,
    UnreadableDocument,
    read_launch,
    read_state,
    same_process,
    send_command,
    signal_group,
    try_lock,
    write_state,
)
from trainer.contract.process import PRIVATE_UMASK

logger = logging.getLogger(__name__)

DELETE_TIMEOUT = 20.0
"""How long a deleted job's supervisor may take to stop its pods before it is SIGKILLed."""
POLL_SECONDS = 0.1
STARTUP_GRACE = 30.0
"""How long a job with launch.json but no state.json yet counts as starting up."""
KILL_TIMEOUT = 10.0
"""How long a SIGKILLed process may take to be gone."""
# The package root, so the supervisor imports this checkout even where it is not installed.
SOURCE_ROOT = Path(__file__).resolve().parents[3]


def child_env(**extra: str) -> dict[str, str]:
    """The control plane's environment for a process it starts (`extra` on top), finding this
    source tree's packages however the control plane was started."""
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")]))}


class Watchdog:
    """The supervisors of one jobs directory, as one API process sees them."""

    def __init__(self, restarts: int, delete_timeout: float = DELETE_TIMEOUT,
                 template: Path | None = None) -> None:
        self.restarts = restarts
        """How often a job's supervisor may die and be replaced before the job fails instead."""
        self.template = template
        """The socket of the fork-server template its supervisors ask for their jobs' fork
        servers (api/backends/local/template.py), if any."""
        self.delete_timeout = delete_timeout
        # Supervisors this process started; polling them reaps them (no zombies in the API).
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()  # routes and the reconciler call in from several threads
        self._revivals: dict[str, int] = {}
        """Supervisors started per job to adopt one that died (some may have died at once)."""
        self._seen: dict[str, StateDocument] = {}
        """The last readable state of each unfinished job: what to stop should it turn
        unreadable."""
        self._deleting: set[str] = set()

    def launch(self, job_dir: JobDir) -> subprocess.Popen[bytes]:
        """Start the supervisor of a job just launched; without one, the launch is undone."""
        with self._lock:
            self._revivals.pop(job_dir.job_id, None)
            self._seen.pop(job_dir.job_id, None)
            try:
                return self._start(job_dir, adopt=False)
            except BackendError:
                job_dir.launch.unlink(missing_ok=True)
                raise

    def tend(self, job_id: str, job_dir: JobDir) -> None:
        """Replace the job's supervisor if it died with the job unfinished; where that cannot
        be done (or its state turned unreadable), kill the pods it listed and finish the job."""
        try:
            state = read_state(job_dir)
        except UnreadableDocument as exc:
            if not self._supervised(job_id):
                self._give_up(job_id, job_dir, self._seen.get(job_id),
                              f"the job's supervisor died and its state is unreadable ({exc}); "
                              "every pod it last listed was stopped")
            return
        if state is None or state.finished:
            self._seen.pop(job_id, None)
            return
        self._seen[job_id] = state
        if not self.alive(job_id, job_dir, state):
            self._revive(job_id, job_dir, state)

    def alive(self, job_id: str, job_dir: JobDir, state: StateDocument | None) -> bool:
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

    def readable_state(self, job_id: str, job_dir: JobDir) -> StateDocument | None:
        """state.json, or the last readable version of it."""
        try:
            return read_state(job_dir)
        except UnreadableDocument:
            return self._seen.get(job_id)

    def stop(self, job_id: str, job_dir: JobDir) -> None:
        """Stop the job's supervisor and every process it runs (a delete); no dead supervisor of
        the job is replaced meanwhile."""
        with self._lock:
            self._deleting.add(job_id)
        try:
            self._stop(job_id, job_dir)
        finally:
            with self._lock:
                self._deleting.discard(job_id)
                self._seen.pop(job_id, None)

    def _stop(self, job_id: str, job_dir: JobDir) -> None:
        state = self.readable_state(job_id, job_dir)
        if self.alive(job_id, job_dir, state):
            send_command(job_dir, DeleteCommand())
            deadline = time.monotonic() + self.delete_timeout
            while (self.alive(job_id, job_dir, state := self.readable_state(job_id, job_dir))
                   and time.monotonic() < deadline):
                time.sleep(POLL_SECONDS)
        supervisor = self._running_supervisor(job_id, state)
        if supervisor is not None:
            # It hung: it goes first, or it would restart the pods killed below.
            logger.warning("job %s: supervisor did not stop in %.0f s: SIGKILL", job_id,
                           self.delete_timeout)
            supervisor.send_signal(signal.SIGKILL)
            with contextlib.suppress(psutil.Error):  # a zombie of another parent never "ends"
                supervisor.wait(timeout=self.delete_timeout)
            state = self.readable_state(job_id, job_dir)  # it may have started pods meanwhile
        if state is None or (not state.finished
                             and self._give_up(job_id, job_dir, state, "deleted")):
            return
        self._kill_listed(job_id, state)

    def _start(self, job_dir: JobDir, adopt: bool) -> subprocess.Popen[bytes]:
        """Start the job's supervisor (the caller holds self._lock)."""
        env = child_env(**({programs.TEMPLATE_ENV: str(self.template)} if self.template else {}))
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

    def _revive(self, job_id: str, job_dir: JobDir, state: StateDocument) -> None:
        """Start a supervisor that adopts the pods of the dead one; where none can be, kill them
        and finish the job."""
        with self._lock:
            if job_id in self._deleting:
                return
            tries = max(state.adoptions, self._revivals.get(job_id, 0))
            self._revivals[job_id] = tries + 1
            if tries >= self.restarts:
                reason = (f"the job's supervisor (pid {state.supervisor_pid}) died and is not "
                          f"replaced again: replaced {tries} times already (the most allowed); "
                          "every pod was stopped")
            else:
                try:
                    if read_launch(job_dir) is None:
                        raise UnreadableDocument(f"no {job_dir.launch.name}")
                    child = self._start(job_dir, adopt=True)
                except BackendError as exc:
                    reason = (f"the job's supervisor (pid {state.supervisor_pid}) died and "
                              f"cannot be replaced ({exc}); every pod was stopped")
                else:
                    logger.warning("job %s: supervisor pid %s died; pid %d adopts its pods",
                                   job_id, state.supervisor_pid, child.pid)
                    return
        self._give_up(job_id, job_dir, state, reason)

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
