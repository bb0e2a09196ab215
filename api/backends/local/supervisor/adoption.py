"""Adoption: a supervisor takes over the pods and coordinator of a dead one, as a restarted
kubelet re-adopts its containers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from api.backends.local.jobdir import StateDocument
from api.backends.local.processes import STOP_GRACE_SECONDS, Pod
from api.backends.local.standby_process import Standby

if TYPE_CHECKING:
    from api.backends.local.supervisor.loop import Supervisor

logger = logging.getLogger(__name__)


def adopt(supervisor: Supervisor, previous: StateDocument) -> None:
    """Take over the pods and coordinator of a dead supervisor as its state lists them."""
    supervisor.adoptions = previous.adoptions + 1
    supervisor.mode, supervisor.final_reason = previous.mode, previous.final_reason
    supervisor.replicas = previous.replicas or supervisor.replicas
    supervisor.replica_ports = previous.replica_ports or supervisor.replica_ports
    supervisor.issued = max([previous.issued, *(record.incarnation for record in previous.pods),
                             *(extra.incarnation for record in previous.pods
                               for extra in (record.surge, record.retiring) if extra)])
    records = {record.ordinal: record for record in previous.pods}
    ordinals = sorted(set(records) | set(range(supervisor.replicas)))
    supervisor.pods = [Pod(ordinal, f"{supervisor.job_id}-{ordinal}") for ordinal in ordinals]
    for pod in supervisor.pods:
        if pod.ordinal in records:
            pod.adopt(records[pod.ordinal], STOP_GRACE_SECONDS)
    if previous.coordinator is not None:
        supervisor.coordinator.adopt(previous.coordinator)
    Standby.discard(previous.standby)
    logger.warning("adopting the job from supervisor pid %s (adoption %d): pods %s",
                   previous.supervisor_pid, supervisor.adoptions,
                   ", ".join(f"{p.name} pid {p.process.pid}" for p in supervisor.pods
                             if p.process is not None) or "none running")
