"""When a live job's standby runs: started once the job is quiet, stopped once it finishes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from api.backends.local.supervisor.loop import Supervisor


def keep_standby(supervisor: Supervisor) -> None:
    """Keep a standby warm while the job runs, started once the job is quiet: every pod
    participates (its ready file exists), the last one `standby.settle_seconds` ago or more."""
    standby = supervisor.standby
    if standby is None:
        return
    if supervisor.mode != "running":
        standby.stop()
        return
    if standby.may_start() and quiet(supervisor, time.time(), standby.settle_seconds):
        standby.start(supervisor.pod_env("", "", None))


def quiet(supervisor: Supervisor, now: float, settle_seconds: float) -> bool:
    for pod in supervisor.pods:
        if pod.removing:
            continue
        if not pod.alive or pod.surge is not None or pod.retiring is not None:
            return False
        try:
            took_part = supervisor.job_dir.ready(pod.name, pod.incarnation).stat().st_mtime
        except OSError:
            return False
        if now - took_part < settle_seconds:
            return False
    return True
