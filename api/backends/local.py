"""The local backend: one detached supervisor process per job, observed through its files.

Everything lives in `jobs_dir/<job_id>/`: `launch.json` (what to run), `state.json` (written by
the supervisor), `commands/` (kill/delete requests for the supervisor), `logs/`. The supervisor
runs in its own session, so it outlives the API process; a new LocalBackend on the same jobs_dir
re-adopts it from these files alone. The layout and the file/process helpers here are shared with
the supervisor (api/backends/supervisor.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from api.backends.base import (
    BackendError,
    Launch,
    PodStatus,
    Resources,
    WorkloadNotFound,
    WorkloadStatus,
)

logger = logging.getLogger(__name__)

LAUNCH_FILE = "launch.json"
STATE_FILE = "state.json"
COMMANDS_DIR = "commands"
LOGS_DIR = "logs"
DEFAULT_MAX_RESTARTS = 5
DEFAULT_BACKOFF_SECONDS = 1.0
JOB_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
DELETE_TIMEOUT = 20.0
POLL_SECONDS = 0.1
STARTUP_GRACE = 30.0
"""How long a job with launch.json but no state.json yet counts as starting up."""
# psutil derives create_time from the boot time, which moves when the wall clock is adjusted.
CREATE_TIME_TOLERANCE = 1.0
# The package root, so the supervisor imports this checkout even where it is not installed.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    """Readers see the old or the new document, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    tmp.replace(path)


def launch_from_document(document: dict[str, Any]) -> Launch:
    """The Launch that `LocalBackend` wrote into a job's launch.json."""
    # Optional fields may be missing from a launch.json written by an older version.
    values = {f.name: document[f.name] for f in dataclasses.fields(Launch) if f.name in document}
    for name in ("checkpoint_dir", "model_dir", "inputs_dir", "cache_dir"):
        values[name] = Path(values[name])
    if values.get("resources") is not None:
        values["resources"] = Resources(**values["resources"])
    return Launch(**values)


def same_process(pid: int | None, started: float | None) -> psutil.Process | None:
    """The live process `pid` if it is the one created at `started`, not a reused pid."""
    if pid is None or started is None:
        return None
    try:
        process = psutil.Process(pid)
        if (abs(process.create_time() - started) > CREATE_TIME_TOLERANCE
                or process.status() == psutil.STATUS_ZOMBIE):
            return None
    except psutil.Error:
        return None
    return process


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def tail_lines(path: Path, lines: int, max_bytes: int = 1 << 20) -> list[str]:
    """The last `lines` lines of a file, reading at most `max_bytes` from its end."""
    if lines <= 0:
        return []
    try:
        with path.open("rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            data = b""
            while end > 0 and data.count(b"\n") <= lines and len(data) < max_bytes:
                start = max(0, end - min(65536, max_bytes - len(data)))
                handle.seek(start)
                data = handle.read(end - start) + data
                end = start
    except (FileNotFoundError, IsADirectoryError):
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    if end > 0:
        text = text[1:]  # the first line read is probably cut
    return text[-lines:]



class LocalBackend:
    name = "local"

    def __init__(self, jobs_dir: Path, max_restarts: int = DEFAULT_MAX_RESTARTS,
                 restart_backoff: float = DEFAULT_BACKOFF_SECONDS) -> None:
        self.jobs_dir = jobs_dir
        self.max_restarts, self.restart_backoff = max_restarts, restart_backoff
        # Supervisors this process started; polling them reaps them (no zombies in the API).
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()  # routes and the reconciler call in from several threads

    def launch(self, launch: Launch) -> None:
        job_dir = self._job_dir(launch.job_id)
        if job_dir.is_dir() and self._alive(launch.job_id, job_dir, self._state(job_dir)):
            raise BackendError(f"job {launch.job_id} already has a running supervisor")
        for sub in (LOGS_DIR, COMMANDS_DIR):
            (job_dir / sub).mkdir(parents=True, exist_ok=True)
        # A previous run's state and commands must not be mistaken for the new supervisor's.
        (job_dir / STATE_FILE).unlink(missing_ok=True)
        for stale in (job_dir / COMMANDS_DIR).iterdir():
            stale.unlink(missing_ok=True)
        write_json_atomic(job_dir / LAUNCH_FILE, self._launch_document(launch), mode=0o600)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")]))}
        try:
            with (job_dir / "supervisor.log").open("ab") as log:
                child = subprocess.Popen(
                    [sys.executable, "-m", "api.backends.supervisor", str(job_dir)],
                    cwd=job_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            (job_dir / LAUNCH_FILE).unlink(missing_ok=True)
            raise BackendError(f"cannot start the supervisor of {launch.job_id}: {exc}") from None
        with self._lock:
            self._children[launch.job_id] = child
        logger.info("job %s: supervisor started (pid %d)", launch.job_id, child.pid)

    def status(self, job_id: str) -> WorkloadStatus:
        job_dir = self._job_dir(job_id)
        if not job_dir.is_dir():
            return WorkloadStatus(present=False)
        state = self._state(job_dir)
        alive = self._alive(job_id, job_dir, state)
        if state is None:
            replicas = int(self._launch(job_dir).get("replicas", 0))
            return WorkloadStatus(present=alive, pods=[
                PodStatus(i, f"{job_id}-{i}", "Pending", 0) for i in range(replicas)])
        finished = bool(state["finished"])
        pods = [PodStatus(ordinal=p["ordinal"], name=p["name"], phase=p["phase"],
                          restarts=p["restarts"], started_at=p["started_at"],
                          exit_code=p["exit_code"]) for p in state["pods"]]
        return WorkloadStatus(present=alive and not finished, pods=pods, finished=finished,
                              reason=state["reason"])

    def kill_pod(self, job_id: str, ordinal: int, grace_seconds: float) -> None:
        job_dir = self._job_dir(job_id)
        if not job_dir.is_dir():
            raise WorkloadNotFound(f"no job {job_id}")
        state = self._state(job_dir)
        if not self._alive(job_id, job_dir, state) or (state and state["finished"]):
            raise WorkloadNotFound(f"job {job_id} has no running supervisor")
        replicas = int(self._launch(job_dir).get("replicas", 0))
        if not 0 <= ordinal < replicas:
            raise WorkloadNotFound(f"job {job_id} has no pod {ordinal} (replicas: {replicas})")
        self._command(job_dir, {"op": "kill", "ordinal": ordinal,
                                "grace_seconds": max(0.0, float(grace_seconds))})
        logger.info("job %s: kill of pod %d requested (grace %.1f s)", job_id, ordinal,
                    grace_seconds)

    def delete(self, job_id: str) -> None:
        job_dir = self._job_dir(job_id)
        if not job_dir.is_dir():
            return
        if self._alive(job_id, job_dir, self._state(job_dir)):
            self._command(job_dir, {"op": "delete"})
            deadline = time.monotonic() + DELETE_TIMEOUT
            while (self._alive(job_id, job_dir, self._state(job_dir))
                   and time.monotonic() < deadline):
                time.sleep(POLL_SECONDS)
        self._kill_listed(job_id, job_dir)
        for command in (job_dir / COMMANDS_DIR).glob("*"):
            command.unlink(missing_ok=True)  # nobody is left to obey them

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        job_dir = self._job_dir(job_id)
        return tail_lines(job_dir / LOGS_DIR / f"{job_id}-{int(ordinal)}.log", lines)

    def active_jobs(self) -> list[str]:
        if not self.jobs_dir.is_dir():
            return []
        active = []
        for job_dir in sorted(self.jobs_dir.iterdir()):
            if not (JOB_ID.fullmatch(job_dir.name) and job_dir.is_dir()):
                continue
            try:
                state = self._state(job_dir)
            except BackendError as exc:
                logger.warning("job %s: %s", job_dir.name, exc)
                continue
            if self._alive(job_dir.name, job_dir, state) and not (state and state["finished"]):
                active.append(job_dir.name)
        return active

    def _job_dir(self, job_id: str) -> Path:
        # Job ids become path components: anything but [a-z0-9-] could escape jobs_dir.
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise WorkloadNotFound(f"invalid job id {job_id!r}")
        return self.jobs_dir / job_id

    def _launch_document(self, launch: Launch) -> dict[str, Any]:
        document = dataclasses.asdict(launch)
        for key, value in document.items():
            if isinstance(value, Path):
                document[key] = str(value.absolute())
        document["max_restarts"] = self.max_restarts
        document["restart_backoff"] = self.restart_backoff
        return document

    @staticmethod
    def _launch(job_dir: Path) -> dict[str, Any]:
        try:
            document: dict[str, Any] = json.loads((job_dir / LAUNCH_FILE).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise BackendError(f"unreadable {LAUNCH_FILE} in {job_dir}: {exc}") from None
        return document

    @staticmethod
    def _state(job_dir: Path) -> dict[str, Any] | None:
        try:
            state: dict[str, Any] = json.loads((job_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise BackendError(f"unreadable {STATE_FILE} in {job_dir}: {exc}") from None
        return state

    def _alive(self, job_id: str, job_dir: Path, state: dict[str, Any] | None) -> bool:
        """Whether the job's supervisor process runs (it may have finished and not exited yet)."""
        exited, running = self._reap_children()
        if job_id in running:
            return True
        if state is not None:
            return same_process(state["supervisor_pid"], state["supervisor_started"]) is not None
        if job_id in exited:
            return False  # it died before writing any state
        # Launched by another API process that has not written its first state yet.
        launch_file = job_dir / LAUNCH_FILE
        return launch_file.is_file() and time.time() - launch_file.stat().st_mtime < STARTUP_GRACE

    def _reap_children(self) -> tuple[set[str], set[str]]:
        """Poll the supervisors this process started, so none stays a zombie: (exited, running)."""
        with self._lock:
            exited = {job_id for job_id, child in self._children.items()
                      if child.poll() is not None}
            for job_id in exited:
                del self._children[job_id]
            return exited, set(self._children)

    @staticmethod
    def _command(job_dir: Path, command: dict[str, Any]) -> None:
        name = f"{time.time_ns()}-{uuid.uuid4().hex}.json"
        write_json_atomic(job_dir / COMMANDS_DIR / name, command)

    def _kill_listed(self, job_id: str, job_dir: Path) -> None:
        """SIGKILL the supervisor and each pod group of state.json that is still that process."""
        state = self._state(job_dir)
        if state is None:
            return
        supervisor = same_process(state["supervisor_pid"], state["supervisor_started"])
        if supervisor is not None:
            # It hung: it goes first, or it would restart the pods killed below.
            logger.warning("job %s: supervisor did not stop in %.0f s: SIGKILL", job_id,
                           DELETE_TIMEOUT)
            supervisor.send_signal(signal.SIGKILL)
            with contextlib.suppress(psutil.Error):  # a zombie of another parent never "ends"
                supervisor.wait(timeout=DELETE_TIMEOUT)
            state = self._state(job_dir) or state  # it may have started pods meanwhile
        coordinator = state.get("coordinator") or {}
        leftovers = [(pod["name"], pod["pid"], pod["pid_started"]) for pod in state["pods"]]
        leftovers.append((coordinator.get("name"), coordinator.get("pid"),
                          coordinator.get("pid_started")))
        for name, pid, started in leftovers:
            if same_process(pid, started) is not None:
                logger.warning("job %s: %s left behind: SIGKILL", job_id,
                               f"pod {name}" if name in {p["name"] for p in state["pods"]}
                               else name)
                signal_group(pid, signal.SIGKILL)
