"""A pod's migration: a new incarnation replaces its process, beside it (live) or after it
(restart); and a live pod that leaves on a kill with a grace, whose next incarnation starts
beside it in the same way."""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from api.backends.local.jobdir import signal_group
from api.backends.local.processes import STOP_GRACE_SECONDS, Extra, Pod
from api.backends.local.supervisor.failures import standby_ready

if TYPE_CHECKING:
    from api.backends.local.supervisor.loop import Supervisor

logger = logging.getLogger(__name__)


def migrate(supervisor: Supervisor, ordinal: int) -> None:
    """Replace the pod's process by a new incarnation. Live: the new one starts beside the
    old one and takes its place in the group (promote_replacements). Restart mode has no room
    for two: the old one stops (an emergency checkpoint) and the new one starts as soon as it
    ended."""
    pod = supervisor.pod(ordinal)
    if pod is None or pod.removing or not pod.alive or supervisor.mode == "finishing":
        logger.warning("migrate: no running pod with ordinal %r; ignored", ordinal)
        return
    if pod.surge is not None or pod.replace_on_exit:
        logger.warning("migrate: pod %s is already migrating; ignored", pod.name)
        return
    if not supervisor.live:
        logger.info("migrate: stopping pod %s, its replacement starts when it ended",
                    pod.name)
        pod.replace_on_exit = True
        supervisor.signal_pod(pod, STOP_GRACE_SECONDS)
        return
    incarnation = supervisor.next_incarnation()
    pod.surge = Extra(supervisor.spawn_pod(pod, incarnation), incarnation, time.time())
    logger.info("migrate: pod %s incarnation %d starts beside incarnation %d (pid %d)",
                pod.name, incarnation, pod.incarnation, pod.surge.process.pid)
    supervisor.write_state()


def promote_replacements(supervisor: Supervisor) -> None:
    """A replacement becomes its pod, and the old process leaves after its step in flight:

    - a hand-over, once the replacement is in the lighthouse, where another pod holds the live
      state and stays: the old one leaves the group as the replacement enters it, so the two
      never compute a step together (three processes sharing the cores of two), and the
      replacement heals from that pod in the next quorum. Should the old one's step end before
      it is told, the three take that step together and it leaves after it, as below;
    - else make before break, once the replacement participates in a step (it healed from the
      old one, the only holder of the state): the old one commits that step beside it.
    """
    for pod in supervisor.pods:
        surge = pod.surge
        if surge is None:
            continue
        took_part = supervisor.job_dir.ready(pod.name, surge.incarnation).exists()
        if not took_part and not can_hand_over(supervisor, pod):
            continue
        if pod.process is not None and pod.alive:
            pod.retiring = Extra(pod.process, pod.incarnation, pod.started_at or 0.0)
            pod.process.stop(STOP_GRACE_SECONDS)
        pod.process, pod.incarnation, pod.started_at = (surge.process, surge.incarnation,
                                                        surge.started_at)
        pod.surge, pod.signalled_at = None, None
        pod.phase, pod.exit_code = "Running", None
        logger.info("migrate: pod %s incarnation %d %s; incarnation %s leaves", pod.name,
                    surge.incarnation, "takes part" if took_part else "takes over",
                    pod.retiring.incarnation if pod.retiring else "none")


def replace_leaving(supervisor: Supervisor, pod: Pod, grace: float) -> bool:
    """A live pod asked to leave (a kill with a grace) while the job's standby is loaded and
    another pod holds the live state: the standby starts as its next incarnation at once,
    beside the old process, which leaves after its step in flight, as the Kubernetes backend
    creates a leaving pod's replacement at once. The replacement joins the quorum that follows
    that step and heals in it, where otherwise the others would compute that step without the
    pod. False where not done (the caller stops the pod alone): restart mode, a pipeline
    replica (its stages live and die whole), a pod already migrating or leaving, no standby
    loaded, and a pod alone with the state (it stops with a checkpoint, which its next
    incarnation resumes from: it must not start before that is written)."""
    if (not supervisor.live or supervisor.stages != 1 or not standby_ready(supervisor)
            or pod.surge is not None or pod.retiring is not None or pod.process is None
            or not holder_besides(supervisor, pod)):
        return False
    pod.retiring = Extra(pod.process, pod.incarnation, pod.started_at or 0.0)
    pod.process.stop(grace)
    supervisor.start_pod(pod)
    logger.info("pod %s incarnation %d leaves; incarnation %d takes over from it", pod.name,
                pod.retiring.incarnation, pod.incarnation)
    return True


def can_hand_over(supervisor: Supervisor, pod: Pod) -> bool:
    """Whether the pod's replacement has joined the lighthouse (it asks for the next quorum)
    while another pod holds the live state. A pipeline replica's stages meet outside the
    lighthouse: its pods never hand over."""
    assert pod.surge is not None
    return (supervisor.stages == 1
            and supervisor.job_dir.replica(pod.name, pod.surge.incarnation).exists()
            and holder_besides(supervisor, pod))


def holder_besides(supervisor: Supervisor, pod: Pod) -> bool:
    """Whether a pod other than `pod` holds the live state and stays: its current process has
    taken part in a step, and it is neither leaving nor asked to."""
    return any(other is not pod and other.alive and other.phase == "Running"
               and not other.removing and not other.stopped
               and supervisor.job_dir.ready(other.name, other.incarnation).exists()
               for other in supervisor.pods)


def reap_extras(supervisor: Supervisor) -> None:
    """End what is left of replacements and leaving incarnations that ended; SIGKILL the
    ones past their grace."""
    now = time.monotonic()
    for pod in supervisor.pods:
        for extra in (pod.surge, pod.retiring):
            if extra is None:
                continue
            if extra.process.poll():
                signal_group(extra.process.pid, signal.SIGKILL)
                if extra is pod.surge:
                    pod.surge = None
                    supervisor.coordinator.report_gone(pod.name, extra.incarnation)
                    logger.warning("migrate: the replacement of pod %s exited with code %s "
                                   "before it took part; the pod runs on as it was",
                                   pod.name, extra.process.exit_code)
                else:
                    pod.retiring = None
                    logger.info("pod %s incarnation %d has left (exit code %s)", pod.name,
                                extra.incarnation, extra.process.exit_code)
                    if extra.process.exit_code != 0:  # it did not leave the group itself
                        supervisor.coordinator.report_gone(pod.name, extra.incarnation)
            elif extra.process.overdue(now):
                logger.warning("pod %s incarnation %d ignored SIGTERM: SIGKILL", pod.name,
                               extra.incarnation)
