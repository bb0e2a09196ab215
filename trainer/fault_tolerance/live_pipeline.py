"""Live fault tolerance for pipelines: each pipeline replica is one torchft replica group.

A replica's `stages` pods are the ranks of one replica group (`group_rank` = stage). Its stage 0
hosts the group's store (REPLICA_STORE, one of the job's own: trainer.fault_tolerance.kv_store), on
which the group's torchft manager meets and its stages form their pipeline (a torch.distributed
world of `stages` ranks). Across replicas, stage s of every replica averages its gradients through
torchft (the manager's group for rank s), so the lighthouse's quorum decides which replicas take
part in a step, exactly as it does for data-parallel pods; a healing replica fetches each
stage's state from the same stage of a live replica.

A replica lives and dies whole: when one of its pods dies, its other stages fail at their next
exchange with it and exit, and the backend recreates them all. That exchange may be the
replica's next quorum, which waits for every stage up to the quorum timeout (a minute), so the
local backend's supervisor stops the other stages at once
(api/backends/local/supervisor/failures.py). Meanwhile the other replicas' next quorum goes on
without it (the backend tells the lighthouse at once, as for any live pod), and the recreated
replica heals from one of them.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.contract import credentials
from trainer.distributed import COLLECTIVE_TIMEOUT, register_pod_gloo
from trainer.fault_tolerance.kv_store import MemberStore, StoreServer
from trainer.fault_tolerance.live import LiveGroup
from trainer.model import DeviceChoice
from trainer.pipeline import Pipelined, PipelineError
from trainer.recovery import LiveRecovery

logger = logging.getLogger(__name__)

PIPELINE_PREFIX = "pipeline"
"""The replica's pipeline world keeps its keys apart from torchft's in the replica's store."""


class LivePipelineRecovery(LiveRecovery):
    """Live rules for pipelines: a checkpoint is one shard per stage, written by the first
    replica's stages together (every epoch end included), so no other pod writes the final one
    and the first replica's stage 0 exports the model it assembles."""

    def writes_final_checkpoint(self, step: int, is_primary: bool) -> bool:
        return False

    def exports(self, is_primary: bool) -> bool:
        return is_primary


def split_address(value: str) -> tuple[str, int]:
    """`host:port` (an IPv6 host in brackets) as (host, port)."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise PipelineError(f"REPLICA_STORE: expected host:port, got {value!r}")
    return host.strip("[]"), int(port)


class LivePipelineGroup(LiveGroup, Pipelined):
    """This pod: stage `ordinal % stages` of pipeline replica `ordinal // stages`, a rank of
    that replica's torchft replica group."""

    recovery = LivePipelineRecovery
    # A stage keeps no failed attempt: a redo would hang on a stage of its replica that chose
    # other shards, and no stage knows what the others kept.
    redoes_steps = False

    def __init__(self, device: DeviceChoice, stages: int, ordinal: int, replica_store: str,
                 pod: str, lighthouse: str, address: str, peer_secret: str,
                 quorum_retries: int, replica_file: Path | None = None) -> None:
        self.stages, self.stage = stages, ordinal % stages
        address = address or socket.gethostname()
        host, port = split_address(replica_store)
        credential = credentials.store_credential(credentials.require(peer_secret,
                                                                      "a live pipeline pod"))
        # Stage 0 hosts the replica's store; every stage (stage 0 too) is its client.
        self._replica_store = (StoreServer(address, port, credential) if self.stage == 0
                               else None)
        # Held here: torch's groups hold only the C++ half of a store written in Python.
        self._replica_client = client = MemberStore(replica_store, credential,
                                                    COLLECTIVE_TIMEOUT)
        backend = register_pod_gloo(address) if device.backend == "gloo" else device.backend
        dist.init_process_group(backend, store=dist.PrefixStore(PIPELINE_PREFIX, client),
                                rank=self.stage, world_size=stages, timeout=COLLECTIVE_TIMEOUT)
        logger.info("stage %d of %d: the replica's pipeline met at %s", self.stage, stages,
                    replica_store)
        self.pipeline_group = dist.group.WORLD
        self.stage_ranks = list(range(stages))
        super().__init__(device, pod=pod, lighthouse=lighthouse, address=address,
                         peer_secret=peer_secret, quorum_retries=quorum_retries,
                         replica_file=replica_file, group_rank=self.stage, group_size=stages,
                         store=client, store_address=(host, port))

    def start_step(self) -> None:
        # The replica's stages meet first: should one have died, the others fail here at once
        # (its connections closed) instead of waiting in the replica group's quorum for it.
        dist.barrier()
        super().start_step()

    @property
    def is_primary(self) -> bool:
        return super().is_primary and self.stage == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # gradients are averaged over a stage's replicas by PipelineModel

    def average_over_replicas(self, flat: torch.Tensor) -> None:
        # torchft's allreduce averages over the step's participants; a failure is recorded
        # and refuses the commit instead of raising (the flat tensor is then discarded).
        self.manager.allreduce(flat).wait()

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        # Within the replica: its last stage holds the loss and the evaluation's counts. A
        # stage that died fails this at once, which ends the replica's other pods too.
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def barrier(self) -> None:
        dist.barrier()  # the replica's stages

    def can_leave(self) -> bool:
        return False  # a stage cannot leave its replica alone

    def close(self) -> None:
        super().close()
        if dist.is_initialized():
            dist.destroy_process_group()
