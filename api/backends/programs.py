"""What each process of a job runs: pure functions shared by every backend.

The local supervisor and the Kubernetes manifests start the same programs with the same flags
and environment, so a job behaves alike on one machine and on a cluster:
- live mode: a torchft lighthouse per job, and pods that run `python -m trainer` as one replica
  group each;
- restart mode: a standalone rendezvous store per job (never hosted by an agent, so no pod's
  death takes it down), and pods that run torchrun's elastic agent
  (`trainer.fault_tolerance.elastic`) around `python -m trainer`.
Every process listens on its pod's address only (127.0.0.1 locally, the pod IP on Kubernetes);
the job's processes accept only each other (each holds the job's peer secret).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePath

from api.backends.base import Launch
from trainer.contract.credentials import SECRET_ENV
from trainer.contract.runtime import LOOPBACK, RENDEZVOUS_BACKEND, SPEC_ENV, Runtime, host_port
from trainer.contract.staged import OFFLINE_ENV

LIGHTHOUSE_PORT = 29510
STORE_PORT = 29400
REPLICA_STORE_PORT = 29520
"""Kubernetes: where a live pipeline replica's stage 0 hosts the store its stages meet at."""
# Dead peers must cost seconds: the lighthouse drops a replica after 0.5 s without heartbeats
# (sent every 0.1 s) and waits up to 1 s for slow ones to join a quorum; the rendezvous drops a
# node whose keep-alives stopped (below) and waits 2 s for late joiners.
HEARTBEAT_TIMEOUT_MS = 500
JOIN_TIMEOUT_MS = 1000
RENDEZVOUS_CONF = ("keep_alive_interval={interval},keep_alive_max_attempt={attempts},"
                   "last_call_timeout=2,join_timeout=600")
KEEP_ALIVE = (1, 5)
"""Seconds between a node's keep-alives, and how many it may miss before the rendezvous drops
it, where nothing tells the store that its pod ended (Kubernetes): a new round waits 5 s for
a dead pod's node."""
TOLD_KEEP_ALIVE = (5, 3)
"""The same where the supervisor tells the store as soon as a pod ends (the local backend),
so a dead node drops at once whatever the expiry: torch's defaults. Every node rewrites the
one state key with compare-and-set, a keep-alive included; a keep-alive a second from each
node made a joining node's writes lose that race for 45 s and more on a loaded machine (four
nodes, 2 cores)."""
ELASTIC_MAX_RESTARTS = 100
"""Worker restarts one restart-mode pod's agent allows; every peer failure costs survivors one.
The job's own restart budget is enforced on pod restarts by the backend."""


@dataclass(frozen=True)
class Endpoint:
    """Where a job's coordinator (lighthouse or rendezvous store) listens, as pods reach it."""

    host: str
    port: int

    def __str__(self) -> str:
        return host_port(self.host, self.port)

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """The endpoint `str` gave (`host:port`, `[ipv6]:port`)."""
        host, _, port = text.rpartition(":")
        return cls(host.removeprefix("[").removesuffix("]"), int(port))


def coordinator_env(launch: Launch) -> dict[str, str]:
    """What a job's lighthouse or rendezvous store needs in its environment: the job's secret,
    to tell its members from strangers."""
    return {SECRET_ENV: launch.peer_secret}


def lighthouse_argv(host: str, port: int, replicas: int, python: str = "python") -> list[str]:
    """The lighthouse of a live job (trainer.fault_tolerance.lighthouse), listening on `host:port`
    (apart, as the store's: a Kubernetes pod's `$(POD_IP)` may be an IPv6 address); the job's
    first quorum waits for its `replicas` (the job's at launch: a restarted lighthouse hears
    replicas past step 0, and waits for none)."""
    return [python, "-m", "trainer.fault_tolerance.lighthouse", "--min_replicas", "1",
            "--replicas", str(replicas),
            "--host", host,
            "--port", str(port),
            "--quorum_tick_ms", "100",
            "--join_timeout_ms", str(JOIN_TIMEOUT_MS),
            "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS)]


def store_argv(port: int, python: str = "python", host: str = LOOPBACK,
               state_file: PurePath | None = None) -> list[str]:
    """The rendezvous store of a restart job, listening on `host:port` (its pod's address);
    keeping its keys in `state_file`, where given, so a restart on the same port loses none."""
    return [python, "-m", "trainer.fault_tolerance.kv_store", "--host", host, "--port", str(port),
            *(("--state-file", str(state_file)) if state_file is not None else ())]


def pod_argv(launch: Launch, coordinator: Endpoint, local_addr: str,
             python: str = "python", ends_told: bool = False) -> list[str]:
    """A trainer pod's command. `local_addr` is how peers reach this pod (restart mode);
    `ends_told`: its supervisor tells the store when a pod ends (TOLD_KEEP_ALIVE)."""
    if launch.fault_tolerance == "live":
        return [python, "-m", "trainer"]
    # The rendezvous admits up to max_replicas nodes: scaling up is one more round. A pipeline
    # needs every stage of every replica: its rounds wait for all of its pods.
    max_nodes = max(launch.spec.max_replicas, launch.pods)
    interval, attempts = TOLD_KEEP_ALIVE if ends_told else KEEP_ALIVE
    conf = RENDEZVOUS_CONF.format(interval=interval, attempts=attempts)
    nodes = (f"{launch.pods}:{launch.pods}" if launch.spec.stages > 1
             else f"1:{max_nodes}")
    return [python, "-m", "trainer.fault_tolerance.elastic", f"--nnodes={nodes}",
            "--nproc-per-node=1", f"--rdzv-backend={RENDEZVOUS_BACKEND}",
            f"--rdzv-endpoint={coordinator}",
            f"--rdzv-id={launch.job_id}", f"--rdzv-conf={conf}",
            f"--max-restarts={ELASTIC_MAX_RESTARTS}", "--monitor-interval=0.2",
            f"--local-addr={local_addr}", "-m", "trainer"]


TEMPLATE_ENV = "MIGRATOR_FORK_TEMPLATE"
"""Local backend: a supervisor's variable, the socket of the fork-server template it asks for
its job's fork server (api/backends/local/template.py)."""


def preloads(launch: Launch) -> tuple[str, ...]:
    """What a job's fork server (trainer.forkserver) imports beyond what every pod does."""
    spec = launch.spec
    extra = ("peft", "trainer.lora") if spec.finetune == "lora" else ()
    return (*extra, *(("trainer.pipeline",) if spec.stages > 1 else ()))


def standby_argv(ready_file: Path, python: str = "python") -> list[str]:
    """A live job's warm standby (trainer.standby): a pod's environment without its identity;
    it creates `ready_file` once loaded and becomes the pod named on its stdin."""
    return [python, "-m", "trainer.standby", "--ready-file", str(ready_file)]


def pod_env(launch: Launch, pod_name: str, coordinator: Endpoint, pod_address: str,
            threads: int, incarnation: str = "", ready_file: Path | None = None,
            replica_file: Path | None = None, replica_store: str | None = None,
            warm_worker: bool = True, fork_workers: bool = True) -> dict[str, str]:
    """A trainer pod's environment, the job's secrets included (REPORT_TOKEN, PEER_SECRET, its
    store credential).

    `pod_address` is how peers reach this pod, and the only address its processes listen on;
    `incarnation` tells this process's reports apart (empty: the trainer makes one up);
    `ready_file` is created once the pod participates in a step (it holds the live state);
    a live pod writes its lighthouse replica id to `replica_file`; a live pipeline pod meets
    its replica's other stages at `replica_store` (host:port); a restart-mode pod keeps a warm
    worker for its next round unless `warm_worker` is false, and forks its workers unless
    `fork_workers` is false.
    """
    live = launch.fault_tolerance == "live"
    runtime = Runtime(job_id=launch.job_id, pod_name=pod_name, incarnation=incarnation,
                      pod_address=pod_address, report_url=launch.report_url,
                      report_token=launch.report_token, checkpoint_dir=launch.checkpoint_dir,
                      model_dir=launch.model_dir, inputs_dir=launch.inputs_dir,
                      cache_dir=launch.cache_dir, ready_file=ready_file,
                      replica_file=replica_file if live else None,
                      replica_store=replica_store if live else None,
                      peer_secret=launch.peer_secret,
                      lighthouse=f"http://{coordinator}" if live else None,
                      **({} if live or warm_worker else {"warm_worker": False}),
                      **({} if live or fork_workers else {"fork_workers": False}))
    # Here the spec leaves the process: as JSON, in the pods' environment.
    # The hub client offline: what a job loads from the hub was staged before its pods start.
    env = {SPEC_ENV: json.dumps(launch.spec.model_dump(mode="json")), **runtime.to_env(),
           **launch.store_env, **OFFLINE_ENV, "OMP_NUM_THREADS": str(max(1, threads))}
    if not live:
        # Workers get their own process-group store on the lowest rank: the rendezvous store
        # stays the agents' alone.
        env |= {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return env
