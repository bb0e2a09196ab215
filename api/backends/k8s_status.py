"""Trainer pods, as the Kubernetes API returns them, seen the way the backend protocol sees pods.

Pure functions over the API's JSON (dicts), so every mapping is tested with literal pod bodies.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from api.backends.base import PodPhase
from api.backends.manifests import POD_INDEX_LABEL, TRAINER
from trainer.contract.process import ExitCode, failure_reason

logger = logging.getLogger(__name__)

ORDINAL_SUFFIX = re.compile(r"-(\d+)$")
# Waiting reasons of a container that is merely on its way up: not worth an event.
STARTING = frozenset({"ContainerCreating", "PodInitializing"})


@dataclass(frozen=True)
class PodView:
    """One trainer pod as last observed."""

    ordinal: int
    name: str
    uid: str
    phase: PodPhase
    container_restarts: int
    started_at: float | None = None
    exit_code: int | None = None
    """Exit code of the container's last run that ended, if any."""
    reason: str | None = None
    """Why the container waits or last ended (`CrashLoopBackOff`, `OOMKilled`, `Error`)."""
    message: str | None = None
    """The last ended run's termination message (its last log lines: FallbackToLogsOnError)."""
    deleting: bool = False
    graceful: bool = False
    """Being deleted with a grace period: its trainer got SIGTERM and may leave gracefully."""


def ordinal_of(pod: dict[str, Any]) -> int | None:
    metadata = pod.get("metadata") or {}
    index = (metadata.get("labels") or {}).get(POD_INDEX_LABEL)
    if index is not None and str(index).isdigit():
        return int(index)
    match = ORDINAL_SUFFIX.search(metadata.get("name", ""))
    return int(match.group(1)) if match else None


def _time(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def view(pod: dict[str, Any]) -> PodView | None:
    """The protocol's view of a trainer pod; None for a pod that is not one (no ordinal)."""
    ordinal = ordinal_of(pod)
    if ordinal is None:
        return None
    metadata, status = pod["metadata"], pod.get("status") or {}
    container: dict[str, Any] = next((c for c in status.get("containerStatuses") or []
                                      if c.get("name") == TRAINER), {})
    state, last = container.get("state") or {}, container.get("lastState") or {}
    running, waiting = state.get("running"), state.get("waiting")
    ended = state.get("terminated") or last.get("terminated")
    exit_code = ended.get("exitCode") if ended else None
    reason = None
    if waiting and waiting.get("reason") not in STARTING:
        reason = waiting.get("reason")
        if reason == "CrashLoopBackOff" and ended and ended.get("reason") == "OOMKilled":
            reason = "CrashLoopBackOff (OOMKilled)"
    elif ended and ended.get("reason") not in (None, "Completed"):
        reason = ended["reason"]
    pod_phase = status.get("phase", "Pending")
    phase: PodPhase
    if pod_phase in ("Succeeded", "Failed"):
        phase = pod_phase
        reason = reason or status.get("reason")
    elif pod_phase == "Unknown":
        phase, reason = "Failed", status.get("reason") or "NodeLost"
    elif state.get("terminated"):
        phase = "Succeeded" if exit_code == 0 else "Failed"
    elif waiting and last.get("terminated") and exit_code != 0:
        phase = "Failed"  # crashed, waiting for the kubelet's restart (CrashLoopBackOff)
    elif pod_phase == "Running" and running:
        phase = "Running"
    else:
        phase = "Pending"
    return PodView(ordinal=ordinal, name=metadata["name"], uid=metadata.get("uid", ""),
                   phase=phase, container_restarts=int(container.get("restartCount", 0)),
                   started_at=_time(running.get("startedAt")) if running else None,
                   exit_code=exit_code, reason=reason,
                   message=ended.get("message") if ended else None,
                   deleting=bool(metadata.get("deletionTimestamp")),
                   graceful=int(metadata.get("deletionGracePeriodSeconds") or 0) > 0)


@dataclass
class Incarnations:
    """Restarts of one ordinal: each new pod (new uid) counts one, unless the one before left
    gracefully (a SIGTERM it honoured with exit code 0), plus its container restarts.

    The StatefulSet recreates a deleted pod with a fresh restartCount; `base` keeps what the
    pods before it used, so the total never goes down.
    """

    uid: str | None = None
    base: int = 0
    count: int = 0
    left: bool = False
    """The current uid left gracefully."""

    @property
    def total(self) -> int:
        return self.base + self.count

    def observe(self, uid: str, container_restarts: int, left: bool = False) -> bool:
        """Account for a pod incarnation seen; True when anything changed."""
        if uid == self.uid:
            changed = container_restarts > self.count or (left and not self.left)
            self.count, self.left = max(self.count, container_restarts), self.left or left
            return changed
        if self.uid is not None:
            self.base += self.count + (0 if self.left else 1)
        self.uid, self.count, self.left = uid, container_restarts, left
        return True


def load_incarnations(annotation: str | None) -> dict[int, Incarnations]:
    if not annotation:
        return {}
    try:
        data = json.loads(annotation)
        return {int(k): Incarnations(v["uid"], int(v["base"]), int(v["count"]),
                                     bool(v.get("left", False)))  # older tallies lack it
                for k, v in data.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring an unreadable incarnations annotation: %s", exc)
        return {}


def dump_incarnations(incarnations: dict[int, Incarnations]) -> str:
    return json.dumps({str(k): asdict(v) for k, v in sorted(incarnations.items())},
                      separators=(",", ":"))


def last_line(message: str | None) -> str | None:
    """The trainer's last error in a termination message (its launcher may log after it), else
    the last line; without the trainer's log prefix, as the local supervisor reports it."""
    return failure_reason((message or "").splitlines())


def give_up_reason(pods: list[PodView], restarts: dict[int, int], budget: int) -> str | None:
    """Why the job cannot go on, as the local supervisor decides it: a pod that exited with the
    trainer's bad-input code (no restart fixes a missing dataset), or one that used up the
    restart budget. None while the StatefulSet should keep recreating."""
    for pod in pods:
        if pod.exit_code == ExitCode.BAD_INPUT:
            detail = last_line(pod.message) or f"exit code {pod.exit_code}"
            return f"pod {pod.name} failed: bad input: {detail}"
    for pod in pods:
        used = restarts.get(pod.ordinal, 0)
        if used > budget:
            return (f"restart budget spent: pod {pod.name} restarted {used} times, last exit "
                    f"code {pod.exit_code}" + (f" ({pod.reason})" if pod.reason else ""))
    return None
