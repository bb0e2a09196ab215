"""The commands an API process drops into the job's `commands/`, each run once."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from api.backends.local.jobdir import (
    DeleteCommand,
    KillCommand,
    MigrateCommand,
    UnreadableDocument,
    pending_commands,
    read_command,
)
from api.backends.local.supervisor.migration import migrate, replace_leaving
from api.backends.local.supervisor.scaling import scale

if TYPE_CHECKING:
    from api.backends.local.supervisor.loop import Supervisor

logger = logging.getLogger(__name__)


def run_commands(supervisor: Supervisor) -> None:
    for path in pending_commands(supervisor.job_dir):
        try:
            command = read_command(path)
        except UnreadableDocument as exc:
            logger.warning("command ignored: %s", exc)
            continue
        finally:
            path.unlink(missing_ok=True)  # a command runs once, even one that failed
        if isinstance(command, DeleteCommand):
            logger.info("delete requested")
            supervisor.stop_group("finishing", "deleted")
        elif isinstance(command, KillCommand):
            kill(supervisor, command.ordinal, command.grace_seconds)
        elif isinstance(command, MigrateCommand):
            migrate(supervisor, command.ordinal)
        else:
            scale(supervisor, command.replicas)


def kill(supervisor: Supervisor, ordinal: int, grace: float) -> None:
    pod = supervisor.pod(ordinal)
    if pod is None or pod.process is None or not pod.alive:
        logger.warning("kill: no running pod with ordinal %r; ignored", ordinal)
        return
    logger.info("kill: pod %s (pid %d), grace %.1f s", pod.name, pod.process.pid, grace)
    if grace == 0 or not replace_leaving(supervisor, pod, grace):
        supervisor.signal_pod(pod, grace)
