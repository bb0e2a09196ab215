"""A job's detached supervisor: kubelet + StatefulSet controller of the local backend.

Run as `python -m api.backends.supervisor <job_dir>`. It starts the job's coordinator (the
torchft lighthouse of a live job, the rendezvous store of a restart job) and one process group per
pod with a stable ordinal, recreates a pod that failed (after a short backoff) while the others
carry on, restarts the coordinator if it dies, obeys the kill/delete commands dropped into
`commands/`, and records everything in `state.json` (replaced atomically) so that any API process
can observe and re-adopt the job. Recovery inside the group is the pods' business: live pods heal
from a peer, restart pods are restarted by their torchrun agents from the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import psutil

from api.backends import commands
from api.backends.base import PodPhase
from api.backends.local import (
    COMMANDS_DIR,
    DEFAULT_BACKOFF_SECONDS,
    DEFAULT_MAX_RESTARTS,
    LAUNCH_FILE,
    LOGS_DIR,
    STATE_FILE,
    launch_from_document,
    signal_group,
    tail_lines,
    write_json_atomic,
)
from trainer.contract.process import ExitCode, failure_reason

logger = logging.getLogger(__name__)

LOCK_FILE = "supervisor.lock"
POLL_SECONDS = 0.1
STOP_GRACE_SECONDS = 10.0

SETTINGS_PREFIX = "MIGRATOR_"  # api.settings.Settings' env prefix

Mode = Literal["running", "finishing"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Pod:
    ordinal: int
    name: str
    restarts: int = 0
    phase: PodPhase = "Pending"
    process: subprocess.Popen[bytes] | None = None
    pid_started: float | None = None
    started_at: float | None = None
    exit_code: int | None = None
    stopped: bool = False
    """The supervisor signalled this incarnation, so it failed even if it exited 0."""
    signalled_at: float | None = None
    """Unix time the supervisor first signalled this incarnation (a kill, a stop)."""
    kill_at: float | None = None
    """Monotonic time at which a signalled incarnation gets SIGKILL."""
    restart_at: float | None = None
    """Monotonic time at which this failed pod is recreated."""

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def to_json(self) -> dict[str, Any]:
        return {"ordinal": self.ordinal, "name": self.name,
                "pid": self.process.pid if self.process else None,
                "pid_started": self.pid_started, "phase": self.phase, "restarts": self.restarts,
                "started_at": self.started_at, "signalled_at": self.signalled_at,
                "exit_code": self.exit_code}


class Supervisor:
    def __init__(self, job_dir: Path, launch: dict[str, Any]) -> None:
        self.job_dir, self.launch = job_dir, launch
        self.job_id: str = launch["job_id"]
        self.max_restarts = int(launch.get("max_restarts", DEFAULT_MAX_RESTARTS))
        self.backoff = float(launch.get("restart_backoff", DEFAULT_BACKOFF_SECONDS))
        self.pods = [Pod(i, f"{self.job_id}-{i}") for i in range(int(launch["replicas"]))]
        self.launch_spec = launch_from_document(launch)
        self.live = self.launch_spec.fault_tolerance == "live"
        self.coordinator: subprocess.Popen[bytes] | None = None
        """The torchft lighthouse (live) or the rendezvous store (restart), on a fixed port."""
        self.coordinator_endpoint = commands.Endpoint("127.0.0.1", free_port())
        self.coordinator_started: float | None = None
        self.coordinator_starts = 0
        self.started = psutil.Process().create_time()
        self.mode: Mode = "running"
        self.final_reason: str | None = None
        self.finished = False
        self.reason: str | None = None
        self._sigterm = False
        self._written = ""

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.write_state()
        try:
            self.ensure_coordinator()
            for pod in self.pods:
                self.start_pod(pod)
            self.write_state()
            while not self.finished:
                time.sleep(POLL_SECONDS)
                self.tick()
        finally:
            self.kill_leftovers()
        logger.info("finished (%s)", self.reason or "every pod succeeded")
        return 0

    def tick(self) -> None:
        if self._sigterm:
            logger.info("SIGTERM: stopping like a delete")
            self._sigterm = False
            self.stop_group("finishing", "deleted")
        self.run_commands()
        self.reap()
        self.ensure_coordinator()
        if self.mode == "running":
            self.check_group()
        elif not any(pod.alive for pod in self.pods):
            self.finished, self.reason = True, self.final_reason
        self.write_state()

    def state(self) -> dict[str, Any]:
        coordinator = self.coordinator
        return {"supervisor_pid": os.getpid(), "supervisor_started": self.started,
                "finished": self.finished, "reason": self.reason,
                "pods": [pod.to_json() for pod in self.pods],
                "coordinator": {"name": "lighthouse" if self.live else "store",
                                "endpoint": str(self.coordinator_endpoint),
                                "pid": coordinator.pid if coordinator else None,
                                "pid_started": self.coordinator_started,
                                "restarts": max(self.coordinator_starts - 1, 0)}}

    def write_state(self) -> None:
        """Write state.json when it changed since the last write."""
        state = self.state()
        text = json.dumps(state)
        if text != self._written:
            write_json_atomic(self.job_dir / STATE_FILE, state)
            self._written = text

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._sigterm = True  # acted on by the loop: a handler must not touch the pods' state

    def ensure_coordinator(self) -> None:
        """Start the job's lighthouse or store, or restart it on the same port if it died."""
        if self.mode == "finishing" or (
                self.coordinator is not None and self.coordinator.poll() is None):
            return
        name = "lighthouse" if self.live else "store"
        if self.coordinator is not None:
            logger.warning("%s exited with code %s: restarting it", name,
                           self.coordinator.returncode)
        endpoint = self.coordinator_endpoint
        argv = (commands.lighthouse_argv(str(endpoint), executable=str(
                    Path(sys.executable).with_name("torchft_lighthouse"))) if self.live
                else commands.store_argv(endpoint.port, python=sys.executable))
        with (self.job_dir / LOGS_DIR / f"{name}.log").open("ab") as handle:
            self.coordinator = subprocess.Popen(
                argv, cwd=self.job_dir, stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.coordinator_starts += 1
        with contextlib.suppress(psutil.Error):
            self.coordinator_started = psutil.Process(self.coordinator.pid).create_time()
        logger.info("%s on %s (pid %d)", name, endpoint, self.coordinator.pid)

    def start_pod(self, pod: Pod) -> None:
        launch = self.launch_spec
        # The control plane's own settings (its admin token, database URL) stay out of the pods:
        # a pod holds only its job's report token.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(SETTINGS_PREFIX)}
        threads = (os.cpu_count() or 1) // len(self.pods)
        env = {**inherited, **commands.pod_env(launch, pod.name, self.coordinator_endpoint,
                                               "127.0.0.1", threads),
               "POD_INCARNATION": str(pod.restarts)}
        argv = commands.pod_argv(launch, self.coordinator_endpoint, "127.0.0.1",
                                 python=sys.executable)
        log = self.job_dir / LOGS_DIR / f"{pod.name}.log"
        with log.open("ab") as handle:
            pod.process = subprocess.Popen(
                argv, env=env, cwd=self.job_dir, stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            pod.pid_started = psutil.Process(pod.process.pid).create_time()
        except psutil.Error:  # it died at once; reap() records how
            pod.pid_started = None
        pod.phase, pod.started_at, pod.stopped, pod.kill_at = "Running", time.time(), False, None
        pod.signalled_at = None
        logger.info("pod %s started: pid %d, restarts %d", pod.name, pod.process.pid,
                    pod.restarts)

    def run_commands(self) -> None:
        for path in sorted((self.job_dir / COMMANDS_DIR).glob("*.json")):
            try:
                self.execute(json.loads(path.read_text()))
            except (OSError, AttributeError, TypeError, ValueError) as exc:
                logger.warning("command %s ignored: %s", path.name, exc)
            finally:
                path.unlink(missing_ok=True)  # a command runs once, even one that failed

    def execute(self, command: Any) -> None:
        op = command.get("op")
        if op == "delete":
            logger.info("delete requested")
            self.stop_group("finishing", "deleted")
        elif op == "kill":
            self.kill(command.get("ordinal"), float(command.get("grace_seconds", 0.0)))
        else:
            logger.warning("unknown command %r ignored", command)

    def kill(self, ordinal: Any, grace: float) -> None:
        valid = isinstance(ordinal, int) and 0 <= ordinal < len(self.pods)
        pod = self.pods[ordinal] if valid else None
        if pod is None or pod.process is None or not pod.alive:
            logger.warning("kill: no running pod with ordinal %r; ignored", ordinal)
            return
        logger.info("kill: pod %s (pid %d), grace %.1f s", pod.name, pod.process.pid, grace)
        self.signal_pod(pod, grace)

    def signal_pod(self, pod: Pod, grace: float) -> None:
        """SIGTERM its group now and SIGKILL it after `grace` seconds (at once for 0)."""
        if pod.process is None or not pod.alive:
            return
        pod.stopped = True
        pod.signalled_at = pod.signalled_at or time.time()
        if grace <= 0:
            signal_group(pod.process.pid, signal.SIGKILL)
            return
        signal_group(pod.process.pid, signal.SIGTERM)
        pod.kill_at = min(pod.kill_at or float("inf"), time.monotonic() + grace)

    def stop_group(self, mode: Mode, reason: str | None) -> None:
        """Stop every live pod (SIGTERM, SIGKILL after the grace) and then finish."""
        if self.mode == "finishing":
            return  # the first reason to finish wins; the pods are already being stopped
        self.mode, self.final_reason = mode, reason
        for pod in self.pods:
            self.signal_pod(pod, STOP_GRACE_SECONDS)

    def reap(self) -> None:
        now = time.monotonic()
        for pod in self.pods:
            if pod.process is None or not pod.alive:
                continue
            code = pod.process.poll()
            if code is None:
                if pod.kill_at is not None and now >= pod.kill_at:
                    logger.warning("pod %s ignored SIGTERM: SIGKILL", pod.name)
                    signal_group(pod.process.pid, signal.SIGKILL)
                    pod.kill_at = None
                continue
            # The leader is gone; anything it left in its group must not outlive it.
            signal_group(pod.process.pid, signal.SIGKILL)
            pod.exit_code, pod.kill_at = code, None
            pod.phase = "Succeeded" if code == 0 and not pod.stopped else "Failed"
            logger.info("pod %s exited with code %d: %s", pod.name, code, pod.phase)

    def check_group(self) -> None:
        failed = [pod for pod in self.pods if pod.phase == "Failed"]
        if not failed:
            if all(pod.phase == "Succeeded" for pod in self.pods):
                self.mode, self.final_reason = "finishing", None
            return
        bad = [p for p in failed if p.exit_code == ExitCode.BAD_INPUT and not p.stopped]
        if bad:
            self.stop_group("finishing", f"pod {bad[0].name} failed: bad input: "
                                         f"{self.last_log_line(bad[0])}")
        else:
            self.recreate_failed(failed)

    def recreate_failed(self, failed: list[Pod]) -> None:
        """Recreate each failed pod alone, after a backoff; the others carry on."""
        if any(pod.phase == "Succeeded" for pod in self.pods):
            # A pod exits 0 only when the group finished training: a pod recreated now would
            # find no peer to join and train alone from an older checkpoint.
            if not any(pod.alive for pod in self.pods):
                self.mode, self.final_reason = "finishing", None
            return
        now = time.monotonic()
        for pod in failed:
            if pod.restarts >= self.max_restarts:
                self.stop_group("finishing", f"restart budget spent: pod {pod.name} restarted "
                                             f"{pod.restarts} times, last exit code "
                                             f"{pod.exit_code}")
                return
            if pod.restart_at is None:
                pod.restart_at = now + self.backoff
                logger.info("pod %s failed: recreating it", pod.name)
            elif now >= pod.restart_at:
                pod.restart_at = None
                pod.restarts += 1
                self.start_pod(pod)

    def last_log_line(self, pod: Pod) -> str:
        """The trainer's last error message (its launcher may log after it), else the last line."""
        lines = tail_lines(self.job_dir / LOGS_DIR / f"{pod.name}.log", 50)
        return failure_reason(lines) or f"exit code {pod.exit_code}"

    def kill_leftovers(self) -> None:
        """Never leave an orphan pod or coordinator, whatever ended the loop."""
        if self.coordinator is not None and self.coordinator.poll() is None:
            signal_group(self.coordinator.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.coordinator.wait(timeout=STOP_GRACE_SECONDS)
        for pod in self.pods:
            if pod.process is not None and pod.alive:
                logger.warning("pod %s still running at exit: SIGKILL", pod.name)
                signal_group(pod.process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pod.process.wait(timeout=STOP_GRACE_SECONDS)
                pod.exit_code, pod.phase = pod.process.returncode, "Failed"
        if not self.finished:
            self.finished, self.reason = True, self.reason or "supervisor stopped unexpectedly"
        self.write_state()


def hold_lock(job_dir: Path) -> int | None:
    """An exclusive lock held for the supervisor's life: one supervisor per job directory."""
    fd = os.open(job_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m api.backends.supervisor <job_dir>\n")
        return 2
    job_dir = Path(args[0]).absolute()
    launch = json.loads((job_dir / LAUNCH_FILE).read_text())
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, force=True,
        format=f"%(asctime)s %(levelname)s job={launch['job_id']} supervisor: %(message)s")
    if hold_lock(job_dir) is None:
        logger.error("another supervisor already runs in %s", job_dir)
        return 1
    supervisor = Supervisor(job_dir, launch)
    try:
        return supervisor.run()
    except Exception as exc:
        logger.exception("supervisor failed")
        supervisor.reason = f"supervisor failed: {type(exc).__name__}: {exc}"
        supervisor.finished = True
        supervisor.write_state()
        return 1


if __name__ == "__main__":
    sys.exit(main())
