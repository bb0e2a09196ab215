"""A pod's migration: a new incarnation replaces its process, beside it (live) or after it
(restart)."""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from api.backends.local.jobdir import signal_group
from api.backends.local.processes import STOP_GRACE_SECONDS, Extra

if TYPE_CHECKING:
    from api.backends.local.supervisor.loop import Supervisor

logger = logging.getLogger(__name__)


def migrate(supervisor: Supervisor, ordinal: int) -> None:
    """Replace the pod's process by a new incarnation. Live: make before break, the new
    one starts beside the old and heals from a peer; once the new one participates in a
    step, the old one commits that step beside it and leaves (promote_replacements).
    Restart mode has no room for two: the old one stops (an emergency checkpoint) and the
    new one starts as soon as it ended."""
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
    """A replacement that participates in a step becomes its pod; the old process leaves."""
    for pod in supervisor.pods:
        surge = pod.surge
        if surge is None or not supervisor.job_dir.ready(pod.name, surge.incarnation).exists():
            continue
        if pod.process is not None and pod.alive:
            pod.retiring = Extra(pod.process, pod.incarnation, pod.started_at or 0.0)
            pod.process.stop(STOP_GRACE_SECONDS)
        pod.process, pod.incarnation, pod.started_at = (surge.process, surge.incarnation,
                                                        surge.started_at)
        pod.surge, pod.signalled_at = None, None
        pod.phase, pod.exit_code = "Running", None
        logger.info("migrate: pod %s incarnation %d takes part; incarnation %s leaves",
                    pod.name, surge.incarnation,
                    pod.retiring.incarnation if pod.retiring else "none")


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
            elif extra.process.overdue(now):
                logger.warning("pod %s incarnation %d ignored SIGTERM: SIGKILL", pod.name,
                               extra.incarnation)
