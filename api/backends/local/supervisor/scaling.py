"""Scaling: the pods a job runs follow its replicas, the highest ordinals leaving first."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from api.backends.local.processes import STOP_GRACE_SECONDS, Pod

if TYPE_CHECKING:
    from api.backends.local.supervisor.loop import Supervisor

logger = logging.getLogger(__name__)


def scale(supervisor: Supervisor, replicas: int) -> None:
    """Run `replicas` pods: start the missing ordinals, stop the highest ones gracefully
    (each leaves after its step; it is dropped, not recreated, once it has ended)."""
    if supervisor.mode == "finishing":
        logger.warning("scale to %d ignored: the job is finishing", replicas)
        return
    logger.info("scale: %d -> %d pods", supervisor.replicas, replicas)
    supervisor.replicas = replicas
    for pod in supervisor.pods:
        if pod.ordinal >= replicas and not pod.removing:
            pod.removing = True
            supervisor.stop_pod(pod, STOP_GRACE_SECONDS)
        elif pod.ordinal < replicas and pod.removing:
            pod.removing = False  # stopped already: it leaves and is recreated
    for ordinal in range(replicas):
        if supervisor.pod(ordinal) is None:
            pod = Pod(ordinal, f"{supervisor.job_id}-{ordinal}")
            supervisor.pods.append(pod)
            supervisor.start_pod(pod)
    supervisor.pods.sort(key=lambda pod: pod.ordinal)


def drop_removed(supervisor: Supervisor) -> None:
    """Pods scaled away are gone once none of their processes runs."""
    for pod in [pod for pod in supervisor.pods if pod.removing]:
        if all(process.poll() for process in pod.processes):
            logger.info("pod %s removed (scaled to %d)", pod.name, supervisor.replicas)
            supervisor.pods.remove(pod)
