"""Live fault tolerance with torchft: every pod is its own replica group under a lighthouse.

The membership is decided per step by a quorum: when a pod dies the survivors carry on without
it (its step is aborted and redone), and a new pod heals from a live peer (weights, optimizer,
sampler cursor, progress) before it participates. `start_step` runs the quorum and heals this
pod where it is behind, before the step it then takes part in; `should_commit` says whether the
step counts.

A participant's rank orders the step's shards between the participants (trainer.sampler), the
lowest ranks taking the larger runs where they do not divide evenly. torchft ranks the
participants by replica id; in a step one of them heals in, the healer is ranked last instead,
so that it, whose shards wait for its heal, takes one of the smaller runs, whatever its pod's
name: migrating pod 0 of a job of two pods and three shards then costs what migrating pod 1
does. The primary stays torchft's rank 0.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.contract import credentials
from trainer.distributed import Group
from trainer.fault_tolerance.binding import PodGloo, PodNccl, manager_server_on, manager_store
from trainer.fault_tolerance.heal import Transport
from trainer.fault_tolerance.lighthouse import leave
from trainer.listen import url_host
from trainer.model import DeviceChoice
from trainer.recovery import LiveRecovery

logger = logging.getLogger(__name__)

# Short timeouts: a dead peer must cost the survivors about a second, not minutes.
COLLECTIVE_TIMEOUT = timedelta(seconds=5)
QUORUM_TIMEOUT = timedelta(seconds=60)
CONNECT_TIMEOUT = timedelta(seconds=10)
IN_MEMORY = ("in-memory", 1)
"""What torchft is told a replica group of one keeps its store at: nothing connects to it."""


class PeerConnectionLost(RuntimeError):
    """This pod dropped its group connections and no new quorum rebuilt them."""


class HealBrokeOff(RuntimeError):
    """A heal wrote part of the live state into this pod's weights, then broke off."""


def lost_a_peer(error: BaseException) -> bool:
    """Whether a collective failed because a peer's connection closed (not a timeout)."""
    message = str(getattr(error, "original_exception", error))
    return "Connection closed by peer" in message or "Connection reset by peer" in message


def step_rank(replica_rank: int, participants: int, up_to_date: int,
              up_to_date_rank: int | None) -> int:
    """A participant's rank in the step from torchft's quorum: its rank by replica id of the
    `participants`, and of the `up_to_date` ones (None where it heals). Where exactly one
    participant heals, the others keep their order and the healer is last; else (several heal:
    none of them knows the others' places among the up-to-date) it is the rank by replica id.
    Every participant reads the same `participants` and `up_to_date`, so they agree."""
    if participants - up_to_date != 1:
        return replica_rank
    return participants - 1 if up_to_date_rank is None else up_to_date_rank


class QuorumSeen:
    """torchft's manager client, keeping the last quorum it answered: the manager keeps only its
    rank and size of it, not which participants are up to date (step_rank)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.last: Any = None

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self._client._quorum(*args, **kwargs)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class LiveGroup(Group):
    """One torchft replica group (this process) of a job coordinated by a lighthouse."""

    shards_evaluation = False  # peers may vanish mid-evaluation: each evaluates the whole split
    recovery = LiveRecovery
    heals = True
    redoes_steps = True  # should_commit refuses a step a peer died in: the survivors redo it

    def __init__(self, device: DeviceChoice, pod: str, lighthouse: str, address: str,
                 peer_secret: str, quorum_retries: int, replica_file: Path | None = None,
                 group_rank: int = 0, group_size: int = 1, store: dist.Store | None = None,
                 store_address: tuple[str, int] = IN_MEMORY) -> None:
        """`group_rank` of `group_size` processes make the replica group, which meets in
        `store` (the job's store at `store_address`, hosted by its rank 0); a group of one keeps
        its keys in memory."""
        from torchft.manager import Manager

        self.device = device
        self.world_size = 1
        self.local_rank = 0
        secret = credentials.require(peer_secret, "a live pod")
        # Where this pod listens and peers reach it: 127.0.0.1 locally, the pod IP on Kubernetes.
        address = address or socket.gethostname()
        credential = credentials.store_credential(secret)
        self._pg = pg = (PodNccl(address, credential, COLLECTIVE_TIMEOUT)
                         if device.backend == "nccl"
                         else PodGloo(address, credential, COLLECTIVE_TIMEOUT))
        self._transport = Transport(address, secret, COLLECTIVE_TIMEOUT)
        with manager_server_on(address), manager_store(store or dist.HashStore()):
            # No sync at step 0 (init_sync): every pod starts from the same seeded model, and a
            # replica syncing in the first step would count as a participant whose shards
            # torchft zeroes, so the first step would lose them (trainer.shards). A synchronous
            # quorum: a pod that heals does so before the step and takes part in it (an
            # asynchronous one would let it only fetch the state in that step, one step later;
            # `start_step` waits for the quorum at once anyway).
            self.manager = Manager(
                pg=pg, load_state_dict=None, state_dict=None, min_replica_size=1,
                init_sync=False, use_async_quorum=False,
                replica_id=credentials.member_id(secret, pod), lighthouse_addr=lighthouse,
                store_addr=store_address[0], store_port=store_address[1],
                rank=group_rank, world_size=group_size,
                timeout=COLLECTIVE_TIMEOUT,
                quorum_timeout=QUORUM_TIMEOUT, connect_timeout=CONNECT_TIMEOUT,
                hostname=url_host(address), checkpoint_transport=self._transport,
                quorum_retries=quorum_retries)
        self._quorums = self.manager._client = QuorumSeen(self.manager._client)
        self._lighthouse = lighthouse
        self._participants = 0
        self._quorum_rank: int | None = None
        """torchft's rank of this participant (by replica id); None where it takes no part."""
        self._step_rank = 0
        self._connections_dropped = False
        logger.info("pod %s joined lighthouse %s", pod, lighthouse)
        if replica_file is not None:
            replica_file.parent.mkdir(parents=True, exist_ok=True)
            replica_file.write_text(self.replica_id)

    @property
    def replica_id(self) -> str:
        """The id the lighthouse knows this process by (torchft adds a uuid to the pod's)."""
        from torchft.manager import REPLICA_ID_KEY

        return str(self.manager._store.get(REPLICA_ID_KEY).decode())  # no public accessor

    @property
    def rank(self) -> int:
        """This participant's rank in the current step's shards (step_rank; 0 where it takes
        no part)."""
        return self._step_rank

    @property
    def healing(self) -> bool:
        return self._quorum_rank is None

    @property
    def participants(self) -> int:
        return self._participants

    @property
    def is_primary(self) -> bool:
        # torchft's rank, not the step's: the primary does not move for a heal step.
        return self._quorum_rank == 0

    @property
    def quorum_id(self) -> int:
        return int(self.manager._quorum_id)  # torchft has no public accessor for it

    def take_heal_report(self) -> dict[str, Any] | None:
        report, self._transport.last_heal = self._transport.last_heal, None
        return report

    def resume_at(self, step: int) -> None:
        # torchft's step decides who heals from whom: it must count the resumed steps too.
        self.manager.load_state_dict({"step": step,
                                      "batches_committed": self.manager.batches_committed()})

    def register_state(self, load: Callable[[dict[str, Any]], None],
                       save: Callable[[], dict[str, Any]]) -> None:
        self.manager.register_state_dict_fn("trainer", load, save)
        # torchft's state dict holds the registered state under "user": a heal's tensors are
        # read straight into this pod's own at the same place.
        self._transport.own_state = lambda: {"user": {"trainer": save()}}

    def start_step(self) -> None:
        previous = self.quorum_id
        self._quorums.last = None
        self.manager.start_quorum()
        if self._transport.damaged:
            raise HealBrokeOff("a heal broke off after it had written part of this pod's "
                               "weights: the pod ends, to be recreated and heal again")
        self._participants = self.manager.num_participants()
        self._quorum_rank = self.manager.participating_rank()
        quorum = self._quorums.last
        if self._quorum_rank is None or quorum is None:
            self._step_rank = self._quorum_rank or 0
        else:
            self._step_rank = step_rank(self._quorum_rank, self._participants,
                                        quorum.max_world_size, quorum.max_replica_rank)
        if self._connections_dropped:
            if self.quorum_id == previous:
                # Only a new quorum rebuilds the connections dropped below: none came (the
                # peer lost was only a network hiccup), so restart and heal like a new pod.
                raise PeerConnectionLost("group connections were dropped and the quorum "
                                         "did not change")
            self._connections_dropped = False

    def wrap(self, model: nn.Module) -> nn.Module:
        from torchft.ddp import DistributedDataParallel

        return DistributedDataParallel(self.manager, model)

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        # Step statistics stay local: a collective outside the gradient sync would need its own
        # failure handling, and each pod reports its own loss anyway.
        return values

    @property
    def alone(self) -> bool:
        return False  # a healing peer gets the step's gradients through the collective

    def sum_exactly(self, values: torch.Tensor) -> torch.Tensor:
        # A failure is torchft's to track: should_commit then refuses the step.
        self.manager.allreduce(values, reduce_op=dist.ReduceOp.SUM).wait()
        return values

    def should_commit(self) -> bool:
        committed = bool(self.manager.should_commit())
        error = self.manager.errored()
        if error is not None and lost_a_peer(error):
            # Peers may still be blocked on this pod inside the failed collective: gloo fails
            # an operation only on a connection it waits on. Closing ours now fails theirs at
            # once instead of at the collective timeout. The dead peer leaves the next quorum,
            # whose reconfiguration builds new connections.
            logger.info("a peer was lost mid-collective: dropping this pod's connections")
            self._pg.abort()
            self._connections_dropped = True
        return committed

    def can_leave(self) -> bool:
        # Another participant must hold the state (a healing pod does not yet).
        return self._participants > 1 and not self.healing

    def leave(self) -> None:
        # The lighthouse forms the next quorum without this replica as soon as it is told,
        # instead of when its heartbeats have been missing for the timeout.
        replica_id = self.replica_id
        leave(self._lighthouse, replica_id, timeout=CONNECT_TIMEOUT.total_seconds())
        logger.info("left the job: told the lighthouse that %s left",
                    credentials.shown(replica_id))

    def close(self) -> None:
        self.manager.shutdown(wait=False)
