"""A local job's directory: the file protocol between LocalBackend and the job's supervisor.

`jobs_dir/<job_id>/` holds `launch.json` (what to run, written once by the backend),
`state.json` (the pods as the supervisor sees them, written only by the holder of
`supervisor.lock`), `commands/` (kill, scale, migrate and delete requests, one file each, each
run once), `logs/` and `ready/` (the files pods create once they take part in a step). Both
sides read and write these documents through the types here and nothing else; the processes a
document names are found again by pid and start time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import psutil
from pydantic import BaseModel, BeforeValidator, Field, TypeAdapter, ValidationError

from api.backends.base import BackendError, Launch, PodPhase

DEFAULT_MAX_RESTARTS = 5
DEFAULT_BACKOFF_SECONDS = 1.0
# psutil derives create_time from the boot time, which moves when the wall clock is adjusted.
CREATE_TIME_TOLERANCE = 1.0

Mode = Literal["running", "finishing"]
T = TypeVar("T")


class UnreadableDocument(BackendError):
    """A job document exists but cannot be read or does not validate."""


@dataclass(frozen=True)
class JobDir:
    """Where each file of one job lives."""

    path: Path

    @property
    def job_id(self) -> str:
        return self.path.name

    @property
    def launch(self) -> Path:
        return self.path / "launch.json"

    @property
    def state(self) -> Path:
        return self.path / "state.json"

    @property
    def commands(self) -> Path:
        return self.path / "commands"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def lock(self) -> Path:
        return self.path / "supervisor.lock"

    @property
    def supervisor_log(self) -> Path:
        return self.path / "supervisor.log"

    @property
    def ready_dir(self) -> Path:
        return self.path / "ready"

    def ready(self, pod: str, incarnation: int) -> Path:
        """Created by the pod's `incarnation` once it participates in a step (it holds the
        live state)."""
        return self.ready_dir / f"{pod}.{incarnation}"

    def replica(self, pod: str, incarnation: int) -> Path:
        """Where the pod's live `incarnation` writes its lighthouse replica id."""
        return self.ready_dir / f"{pod}.{incarnation}.replica"

    def log(self, process: str) -> Path:
        """The log of a pod (by its name) or of the coordinator (`lighthouse`, `store`)."""
        return self.logs / f"{process}.log"


@dataclass(frozen=True)
class LaunchDocument:
    """launch.json: the job as launched, and the restart policy its supervisor applies."""

    launch: Launch
    max_restarts: int = DEFAULT_MAX_RESTARTS
    restart_backoff: float = DEFAULT_BACKOFF_SECONDS
    standby: bool = True
    """A live job keeps a warm standby process that the next pod to start becomes."""
    fork_pods: bool = True
    """Pods start as forks of the job's fork server (api/backends/local/forking.py)."""


class ProcessRecord(BaseModel):
    """One more process group of a pod during a migration."""

    pid: int
    pid_started: float | None
    incarnation: int
    started_at: float


class StandbyRecord(BaseModel):
    """A live job's warm standby (trainer.standby): loaded once `ready`."""

    pid: int
    pid_started: float | None
    ready: bool = False


class PodRecord(BaseModel):
    """One pod in state.json; `pid` and `pid_started` name its current (or last) process group."""

    ordinal: int
    name: str
    pid: int | None = None
    pid_started: float | None = None
    phase: PodPhase = "Pending"
    restarts: int = 0
    """Incarnations that failed and were recreated (the restart budget counts these)."""
    incarnation: int = 0
    """Of the current process: 0 at the launch, then the job's next number at every start
    (StateDocument.issued), graceful leaves and migrations included."""
    started_at: float | None = None
    signalled_at: float | None = None
    """Unix time the supervisor first signalled this incarnation (a kill, a stop)."""
    exit_code: int | None = None
    """Of the last incarnation that ended; None while running, or when no supervisor could
    see it end (it was adopted, or died while none watched)."""
    removing: bool = False
    """Scaled away: stopped, and dropped from the pods once it has ended."""
    replace_on_exit: bool = False
    """Migrating where no replacement can run beside it (restart mode): recreated at once when
    it has stopped, with no restart counted."""
    surge: ProcessRecord | None = None
    """A migration's replacement, running beside the current incarnation until it takes part."""
    retiring: ProcessRecord | None = None
    """An incarnation a replacement took over from, leaving."""

    @property
    def migrating(self) -> bool:
        """A migration of it is under way: its replacement runs, or it stops to make room."""
        return self.surge is not None or self.replace_on_exit


class CoordinatorRecord(BaseModel):
    """The job's lighthouse (live) or rendezvous store (restart), as state.json lists it."""

    name: Literal["lighthouse", "store"]
    endpoint: str
    """`host:port`; the pods are configured with it, so it never changes."""
    pid: int | None = None
    pid_started: float | None = None
    restarts: int = 0


class StateDocument(BaseModel):
    """state.json. Fields added after the first version have defaults, so that a document
    written by an older supervisor still reads (its job survives a control-plane upgrade)."""

    supervisor_pid: int | None
    supervisor_started: float | None
    finished: bool = False
    reason: str | None = None
    """Why the job ended early (restart budget spent, bad input, deleted); None otherwise."""
    pods: list[PodRecord]
    coordinator: CoordinatorRecord | None = None
    mode: Mode = "running"
    """`finishing`: the pods are being stopped, and none will be recreated."""
    final_reason: str | None = None
    """The `reason` the job finishes with once every pod has stopped."""
    adoptions: int = 0
    """How often a new supervisor took over this job from a dead one."""
    replicas: int | None = None
    """The pods asked for, once the job was scaled (None: the launch's replicas)."""
    replica_ports: list[int] = []
    """A live pipeline job's: the port where each replica's stages meet (REPLICA_STORE)."""
    issued: int = 0
    """The highest incarnation number started in the job: each new process takes the next, so
    an ordinal scaled away and back never repeats one (its reports would count as duplicates)."""
    standby: StandbyRecord | None = None

    def listed_processes(self) -> list[tuple[str, int, float | None]]:
        """(what, pid, start time) of every pod group and coordinator this state names."""
        listed = [(f"pod {pod.name}", pod.pid, pod.pid_started) for pod in self.pods
                  if pod.pid is not None]
        listed += [(f"pod {pod.name} incarnation {extra.incarnation}", extra.pid,
                    extra.pid_started) for pod in self.pods
                   for extra in (pod.surge, pod.retiring) if extra is not None]
        if self.standby is not None:
            listed.append(("standby", self.standby.pid, self.standby.pid_started))
        if self.coordinator is not None and self.coordinator.pid is not None:
            listed.append((self.coordinator.name, self.coordinator.pid,
                           self.coordinator.pid_started))
        return listed


class KillCommand(BaseModel):
    """Kill one pod as a node failure would: SIGTERM, then SIGKILL after the grace."""

    op: Literal["kill"] = "kill"
    ordinal: int
    grace_seconds: float = Field(default=0.0, ge=0.0)


class DeleteCommand(BaseModel):
    """Stop every pod and finish the job with the reason `deleted`."""

    op: Literal["delete"] = "delete"


class ScaleCommand(BaseModel):
    """Run `replicas` pods: add the missing ordinals, stop the highest ones (they leave)."""

    op: Literal["scale"] = "scale"
    replicas: int = Field(ge=1)


class MigrateCommand(BaseModel):
    """Replace one pod's process by a new incarnation: live, the new one starts beside the old
    and the old leaves once the new one takes part; restart mode, the old one stops first."""

    op: Literal["migrate"] = "migrate"
    ordinal: int


AnyCommand = KillCommand | DeleteCommand | ScaleCommand | MigrateCommand
Command = Annotated[AnyCommand, Field(discriminator="op")]


def _nest_launch(data: Any) -> Any:
    """launch.json is flat: the Launch's fields next to the policy's (which older files lack)."""
    if not isinstance(data, dict):
        return data
    policy = {k: data[k] for k in ("max_restarts", "restart_backoff", "standby", "fork_pods")
              if k in data}
    if "heal_secret" in data:  # a live job's secret, as the previous version named it
        data = {"peer_secret": data["heal_secret"], **data}
    if "replicas" in data:  # the pods, as earlier versions named them
        data = {"pods": data["replicas"], **data}
    return {"launch": data, **policy}


_LAUNCH = TypeAdapter(Launch)
_LAUNCH_DOCUMENT = TypeAdapter(Annotated[LaunchDocument, BeforeValidator(_nest_launch)])
_STATE = TypeAdapter(StateDocument)
_COMMAND: TypeAdapter[Command] = TypeAdapter(Command)


def write_json_atomic(path: Path, data: Any) -> None:
    """Readers see the old or the new document, never half of one; only this user reads it
    (launch.json holds the job's secrets)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    tmp.replace(path)


def _read(path: Path, adapter: TypeAdapter[T]) -> T | None:
    """The document at `path`, None if there is none."""
    try:
        return adapter.validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnreadableDocument(f"unreadable {path.name}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}"
                             for e in exc.errors()[:3])
        raise UnreadableDocument(f"invalid {path.name}: {problems}") from None


def write_launch(job_dir: JobDir, document: LaunchDocument) -> None:
    data = _LAUNCH.dump_python(document.launch, mode="json")
    for field in dataclasses.fields(Launch):
        # Pods run in the job directory: a relative path would change meaning there.
        if isinstance(value := getattr(document.launch, field.name), Path):
            data[field.name] = str(value.absolute())
    data |= {"max_restarts": document.max_restarts, "restart_backoff": document.restart_backoff,
             "standby": document.standby, "fork_pods": document.fork_pods}
    write_json_atomic(job_dir.launch, data)


def read_launch(job_dir: JobDir) -> LaunchDocument | None:
    return _read(job_dir.launch, _LAUNCH_DOCUMENT)


def write_state(job_dir: JobDir, state: StateDocument) -> None:
    write_json_atomic(job_dir.state, state.model_dump(mode="json"))


def read_state(job_dir: JobDir) -> StateDocument | None:
    return _read(job_dir.state, _STATE)


def send_command(job_dir: JobDir, command: AnyCommand) -> None:
    # Names sort in the order the commands were sent.
    name = f"{time.time_ns()}-{uuid.uuid4().hex}.json"
    write_json_atomic(job_dir.commands / name, command.model_dump(mode="json"))


def pending_commands(job_dir: JobDir) -> list[Path]:
    """The commands not yet run, oldest first."""
    return sorted(job_dir.commands.glob("*.json"))


def read_command(path: Path) -> AnyCommand:
    command = _read(path, _COMMAND)
    if command is None:
        raise UnreadableDocument(f"command {path.name} vanished")
    return command


def try_lock(job_dir: JobDir, wait: float = 0.0) -> int | None:
    """An exclusive lock on the job's directory (a descriptor to close), or None where another
    process holds it for `wait` seconds: whoever holds it is the job's supervisor (or acts for
    one), the only writer of state.json."""
    fd = os.open(job_dir.lock, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


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
