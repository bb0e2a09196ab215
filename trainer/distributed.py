"""The trainer's process group: torch.distributed under torchrun, or a single process.

The trainer talks to its group only through `Group`'s methods, so the fault-tolerance engines can
provide groups whose membership changes between steps (`participants` and `rank` may differ from
one step to the next, and `should_commit` may refuse a step).
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.contract import credentials
from trainer.fault_tolerance.kv_store import MemberStore, StoreServer
from trainer.listen import gloo_backend, url_host
from trainer.model import DeviceChoice
from trainer.recovery import Recovery

logger = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT = timedelta(seconds=60)
STOP_GRACE_SECONDS = 10.0
"""How long a collective may still wait once the worker got SIGTERM (see `Group.stopping`):
torchrun SIGKILLs a worker 30 s after its SIGTERM, and the emergency checkpoint needs the rest."""
WAIT_SLICE = timedelta(seconds=0.5)
"""A collective is waited for in slices this long, so a SIGTERM's handler runs between them."""
POD_GLOO = "pod-gloo"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies, as everything in a dead pod dies.

    Torchrun starts its workers in sessions of their own, so a worker would otherwise outlive
    its killed agent and train on alone.
    """
    if sys.platform.startswith("linux"):
        libc: Any = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


STACKS_SIGNAL = signal.SIGUSR1
"""Asks a torchrun worker for its threads' stacks (`show_stacks_on_request`)."""


def show_stacks_on_request() -> None:
    """Write every thread's stack to stderr (the pod's log) on STACKS_SIGNAL, from C, so even
    while the main thread waits in a collective: the agent asks before it SIGKILLs a worker
    that outlived its SIGTERM (trainer.fault_tolerance.warm_worker), saying where it hung."""
    faulthandler.register(STACKS_SIGNAL, all_threads=True)


def init_process_group(backend: str, rank: int, world_size: int, address: str,
                       environ: Mapping[str, str], peer_secret: str,
                       ) -> tuple[StoreServer | None, MemberStore | None]:
    """torchrun's world, on the pod's address and among the job's members where a pod address
    is given; the store this worker hosts (the lowest rank's) and its client, which the caller
    keeps alive (torch's groups hold only the C++ half of a store written in Python).

    By default the lowest rank's store (MASTER_ADDR:MASTER_PORT, hosted by that worker when the
    agents do not share theirs) is a TCPStore that listens on every interface and answers
    anyone, and gloo listens on the host name's address.
    """
    if not address:  # torchrun run by hand: torch's defaults
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
        return None, None
    credential = credentials.store_credential(credentials.require(peer_secret,
                                                                  "a restart-mode pod"))
    port = int(environ["MASTER_PORT"])
    hosted = StoreServer(address, port, credential) if rank == 0 else None
    store = MemberStore(f"{url_host(environ['MASTER_ADDR'])}:{port}", credential,
                        COLLECTIVE_TIMEOUT)
    if backend == "gloo":
        backend = register_pod_gloo(address)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                            timeout=COLLECTIVE_TIMEOUT)
    return hosted, store


def register_pod_gloo(address: str) -> str:
    """A gloo backend listening on `address`, registered for CPU tensors; its name.

    torch.distributed builds its own gloo backend with the default device and takes no options
    for it, so this one comes through the registry of third-party backends.
    """
    if POD_GLOO not in dist.Backend.backend_list:
        def create(store: dist.Store, rank: int, world_size: int,
                   timeout: timedelta) -> dist.ProcessGroupGloo:
            return gloo_backend(store, rank, world_size, timeout, address)

        dist.Backend.register_backend(POD_GLOO, create, devices=["cpu"])
    return POD_GLOO


class CollectiveAbandoned(RuntimeError):
    """A collective still waited `STOP_GRACE_SECONDS` after this worker's SIGTERM."""


class Group:
    """torchrun's static world (WORLD_SIZE/RANK env), or a world of one without torchrun."""

    shards_evaluation = True
    """Participants evaluate disjoint shards and sum the results."""

    recovery: type[Recovery] = Recovery
    """The fault-tolerance rules the training loop follows in this group."""

    heals = False
    """Whether a pod may take its state from a peer (a live heal) rather than from a checkpoint
    or its own start."""

    redoes_steps = False
    """Whether a step that fails is redone by this process with the weights it started from
    (trainer.shards keeps what the failed attempt computed); a static world never fails one."""

    _stopping_since: float | None = None
    """When this worker got SIGTERM (`stopping`)."""

    def __init__(self, device: DeviceChoice, environ: Mapping[str, str] = os.environ,
                 address: str = "", peer_secret: str = "") -> None:
        """`environ` holds torchrun's world (WORLD_SIZE, RANK, MASTER_ADDR...); `address` is the
        pod's (Runtime.pod_address), the only one its stores and gloo listen on, and its store
        answers holders of `peer_secret` only."""
        self.device = device
        self.world_size = int(environ.get("WORLD_SIZE", "1"))
        self._rank = int(environ.get("RANK", "0"))
        self.local_rank = int(environ.get("LOCAL_RANK", "0"))
        self._stores: tuple[StoreServer | None, MemberStore | None] = (None, None)
        if self.world_size > 1 and not dist.is_initialized():
            self._stores = init_process_group(device.backend, self._rank, self.world_size,
                                              address, environ, peer_secret)
            logger.info("joined process group: rank %d of %d (%s)", self._rank, self.world_size,
                        device.backend)

    @property
    def rank(self) -> int:
        """This participant's rank in the current step."""
        return self._rank

    @property
    def healing(self) -> bool:
        """True while this participant is fetching live state and must not train on data."""
        return False

    @property
    def participants(self) -> int:
        """Participants in the current step."""
        return self.world_size

    @property
    def is_primary(self) -> bool:
        """The lowest-ranked participant writes shared state (checkpoints, model, job metrics)."""
        return self._rank == 0

    @property
    def quorum_id(self) -> int:
        """Changes whenever the set of participants changes (a static world never does)."""
        return 0

    def take_heal_report(self) -> dict[str, Any] | None:
        """Source, bytes and seconds of the live state fetched since the last call, if any."""
        return None

    def start_step(self) -> None:
        """Form the group for the next step (a static world is always the same)."""

    def resume_at(self, step: int) -> None:
        """Training resumed from a checkpoint at `step` (a static group keeps no step count)."""

    def register_state(self, load: Callable[[dict[str, Any]], None],
                       save: Callable[[], dict[str, Any]]) -> None:
        """What a joining participant fetches from a live peer (a static world never heals)."""

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        device_ids = [self.device.device.index] if self.device.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def stopping(self) -> None:
        """This worker got SIGTERM: a collective that still waits `STOP_GRACE_SECONDS` from now
        raises `CollectiveAbandoned`, and the trainer keeps its last committed step (an emergency
        checkpoint) as after any failed collective.

        torchrun's agent SIGTERMs its worker when the job's membership changes, and SIGKILLs it
        30 s later. A peer that dies closes its connections, and a collective waiting on it fails
        at once. A peer whose connections stay open (its node lost, or the process hung) would
        keep this worker in the collective past that SIGKILL, and its last steps would be lost.
        """
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()

    def _wait(self, work: dist.Work) -> None:
        """Wait for `work` (an async collective of the world), in slices (`stopping`)."""
        while True:
            try:
                work.wait(WAIT_SLICE)
                return
            except RuntimeError:
                if work.is_completed():  # it failed (a peer closed its connections, a timeout)
                    raise
            since = self._stopping_since
            if since is not None and time.monotonic() - since > STOP_GRACE_SECONDS:
                raise CollectiveAbandoned(
                    f"a collective still waited {STOP_GRACE_SECONDS:.0f} s after this worker's "
                    "SIGTERM: a peer is gone without closing its connections, or hung")

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a small tensor over participants (in place) and return it."""
        if self.world_size > 1:
            self._wait(dist.all_reduce(values, op=dist.ReduceOp.SUM, async_op=True))
        return values

    @property
    def alone(self) -> bool:
        """Whether this process is the whole group: a step's sums need no collective."""
        return self.world_size == 1

    def sum_exactly(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a float64 buffer over the step's participants (in place; a healing one adds
        zeros) and return it: the gradients of a fixed global batch (trainer.shards)."""
        return self.all_reduce_sum(values)

    def barrier(self) -> None:
        """Wait until every process of the world got here (a static world's)."""
        if self.world_size > 1:
            self._wait(dist.barrier(async_op=True))

    def should_commit(self) -> bool:
        """Whether the step just computed may be committed; a static group always commits."""
        return True

    def can_leave(self) -> bool:
        """Whether this participant may leave alone, its peers training on without a pause (a
        static world stops and restarts together instead)."""
        return False

    def leave(self) -> None:
        """Leave after the last committed step: tell the peers' coordinator at once."""
        raise NotImplementedError("a static world cannot lose a participant without a restart")

    def close(self) -> None:
        """Nothing to release: the process group ends with the process (see __main__)."""
