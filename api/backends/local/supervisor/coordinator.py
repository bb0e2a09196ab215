"""The job's coordinator: its torchft lighthouse (live) or rendezvous store (restart), kept
running on one port for the job's life."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import time

import grpc
import psutil

from api.backends import programs
from api.backends.base import Launch
from api.backends.local.jobdir import CoordinatorRecord, JobDir, signal_group
from api.backends.local.processes import STOP_GRACE_SECONDS, Adopted, Start, Watched
from api.backends.local.supervisor.environment import free_port, inherited_env
from trainer.contract import credentials
from trainer.contract.staged import OFFLINE_ENV
from trainer.fault_tolerance import lighthouse, store_wire

logger = logging.getLogger(__name__)

STORE_STATE = "store.json"
"""The rendezvous store's keys, in the job's directory: restarted, it serves them again."""
LIGHTHOUSE_TIMEOUT = 1.0
"""Seconds a call to the lighthouse or the store may take (milliseconds when it runs)."""
LISTEN_SECONDS = 15.0
"""How long a job's first pods wait for its coordinator to listen (spawned, it imports first)."""
LISTEN_POLL_SECONDS = 0.02


class Coordinator:
    """The job's lighthouse or store, on a fixed port: the pods know it by its endpoint."""

    def __init__(self, job_dir: JobDir, launch: Launch, start: Start) -> None:
        self.job_dir, self.launch, self._start = job_dir, launch, start
        self.live = launch.fault_tolerance == "live"
        self.name = "lighthouse" if self.live else "store"
        self.process: Watched | None = None
        self.endpoint = programs.Endpoint(programs.LOOPBACK, free_port())
        self.starts = 0

    def adopt(self, record: CoordinatorRecord) -> None:
        """Take over the coordinator a dead supervisor recorded."""
        # The pods know the coordinator by this endpoint: a new one must listen there too.
        self.endpoint = programs.Endpoint.parse(record.endpoint)
        self.starts = record.restarts + 1
        if record.pid is not None:
            self.process = Adopted(record.pid, record.pid_started)

    def running(self) -> bool:
        return self.process is not None and not self.process.poll()

    def start(self) -> None:
        """Start it, or restart it on the same port if it ended."""
        if self.process is not None:
            code = self.process.exit_code
            logger.warning("%s exited with code %s: restarting it", self.name,
                           "unknown" if code is None else code)
        endpoint = self.endpoint
        argv = (programs.lighthouse_argv(endpoint.host, endpoint.port,
                                        self.launch.spec.replicas, python=sys.executable)
                if self.live else
                programs.store_argv(endpoint.port, python=sys.executable, host=endpoint.host,
                                    state_file=self.job_dir.path / STORE_STATE))
        # Forked where the job's fork server serves: spawned, the store imports torch (1.9 s
        # of CPU) and the lighthouse gRPC (0.4 s) before they listen, and the first pods wait.
        # The hub offline, as for the pods: it never calls the hub, and the server forks only
        # a process whose libraries would read at import what they read in the server.
        self.process = self._start(argv, self.job_dir.log(self.name),
                                   {**inherited_env(store_credentials=False), **OFFLINE_ENV,
                                    **programs.coordinator_env(self.launch)}, False)
        self.starts += 1
        logger.info("%s on %s (pid %d)", self.name, endpoint, self.process.pid)

    def wait_listening(self, timeout: float = LISTEN_SECONDS) -> None:
        """Until its process listens on its port, ends, or `timeout` passes: a pod's client
        retries a coordinator that does not listen yet after growing delays (torch's store
        client: 0.6 s, then 0.9 s, 1.4 s, ...), and forked pods start before a spawned one
        listens."""
        deadline = time.monotonic() + timeout
        while self.process is not None and not self.process.poll():
            with contextlib.suppress(psutil.Error):
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.endpoint.port
                       for c in psutil.Process(self.process.pid).net_connections("inet")):
                    return
            if time.monotonic() >= deadline:
                return
            time.sleep(LISTEN_POLL_SECONDS)

    def record(self) -> CoordinatorRecord:
        process = self.process
        return CoordinatorRecord(name=self.name, endpoint=str(self.endpoint),
                                 pid=process.pid if process else None,
                                 pid_started=process.started if process else None,
                                 restarts=max(self.starts - 1, 0))

    def kill(self) -> None:
        """SIGKILL it if it runs, and wait until it is gone."""
        if self.process is not None and not self.process.poll():
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_GRACE_SECONDS)

    def report_gone(self, pod: str, incarnation: int, replaced: bool = False) -> None:
        """Tell a live job's lighthouse that this incarnation died, so its peers' next quorum
        forms without waiting for its heartbeats to expire (a pod that leaves says so itself);
        `replaced`: the standby takes its place at once, so that quorum waits for it."""
        replica = self.job_dir.replica(pod, incarnation)
        try:
            replica_id = replica.read_text().strip()
        except OSError:
            return  # it died before it joined: the lighthouse never knew it
        replica.unlink(missing_ok=True)  # written by live pods only
        if not replica_id:
            return
        try:
            lighthouse.leave(f"http://{self.endpoint}", replica_id, timeout=LIGHTHOUSE_TIMEOUT,
                             replaced=replaced)
        except grpc.RpcError as exc:  # its heartbeats expire all the same
            logger.warning("could not tell the lighthouse that %s is gone: %s", replica_id,
                           exc.code() if isinstance(exc, grpc.Call) else exc)
            return
        logger.info("told the lighthouse that %s (pod %s incarnation %d) is gone%s", replica_id,
                    pod, incarnation, ", replaced at once" if replaced else "")

    def forget_node(self, pod: str, pid: int) -> None:
        """Tell a restart job's store that this pod's process (its torchrun agent) ended, so
        its rendezvous node is dropped at the next sync: the survivors' next round forms
        without waiting for its keep-alives to expire (programs.RENDEZVOUS_CONF)."""
        credential = credentials.store_credential(self.launch.peer_secret)
        try:
            reply = store_wire.call(str(self.endpoint), credential, "forget_node",
                                    LIGHTHOUSE_TIMEOUT, run_id=self.launch.job_id, pid=pid,
                                    addr=programs.LOOPBACK)
        except grpc.RpcError as exc:  # its keep-alives expire all the same
            logger.warning("could not tell the store that pod %s (pid %d) ended: %s", pod,
                           pid, exc.code() if isinstance(exc, grpc.Call) else exc)
            return
        if reply.get("count"):
            logger.info("told the store that pod %s (pid %d) ended", pod, pid)
