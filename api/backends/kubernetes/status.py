"""Trainer pods, as the Kubernetes API returns them, seen the way the backend protocol sees pods.

Pure functions over the API's JSON (dicts), so every mapping is tested with literal pod bodies.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from api.backends.base import PodPhase
from api.backends.kubernetes.labels import (
    INCARNATION_LABEL,
    ORDINAL_LABEL,
    REPLACES_LABEL,
    TRAINER,
)
from api.backends.policy import bad_input, bad_input_reason, budget_spent_reason, over_budget
from trainer.contract.process import failure_reason

logger = logging.getLogger(__name__)

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
    incarnation: int = 0
    replaces: int | None = None
    """A migration's replacement: the incarnation it takes over from once ready."""
    ready: bool = False
    """Its trainer participates in steps and reports (the readiness probe)."""
    node: str | None = None
    unschedulable: bool = False
    """The scheduler found no node for it (a migration to a node that cannot take it)."""
    gated: bool = False
    """Held off the scheduler (a restart-mode migration's replacement, until its turn)."""
    terminal: bool = False
    """The pod ended for good (evicted, say): it is replaced, never restarted in place."""
    created: float | None = None
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


def _number(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key)
    return int(value) if value is not None and str(value).isdigit() else None


def ordinal_of(pod: dict[str, Any]) -> int | None:
    return _number((pod.get("metadata") or {}).get("labels") or {}, ORDINAL_LABEL)


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
    pod_labels = metadata.get("labels") or {}
    return PodView(ordinal=ordinal, name=metadata["name"], uid=metadata.get("uid", ""),
                   phase=phase, container_restarts=int(container.get("restartCount", 0)),
                   incarnation=_number(pod_labels, INCARNATION_LABEL) or 0,
                   replaces=_number(pod_labels, REPLACES_LABEL),
                   ready=bool(container.get("ready")), node=(pod.get("spec") or {}).get("nodeName"),
                   gated=bool((pod.get("spec") or {}).get("schedulingGates")),
                   unschedulable=any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                                     and c.get("reason") == "Unschedulable"
                                     for c in status.get("conditions") or []),
                   terminal=pod_phase in ("Succeeded", "Failed"),
                   created=_time(metadata.get("creationTimestamp")),
                   started_at=_time(running.get("startedAt")) if running else None,
                   exit_code=exit_code, reason=reason,
                   message=ended.get("message") if ended else None,
                   deleting=bool(metadata.get("deletionTimestamp")),
                   graceful=int(metadata.get("deletionGracePeriodSeconds") or 0) > 0)


@dataclass
class Incarnations:
    """Restarts of one ordinal: its pods' container restarts, plus one for each of its pods
    that ended other than by leaving gracefully (a SIGTERM it honoured with exit code 0: a
    scale-down, a migration, a kill with a grace).

    `base` holds what the pods that ended used; `pods` the pods that may still run, by uid:
    (container restarts, left gracefully). The total never goes down.
    """

    base: int = 0
    pods: dict[str, tuple[int, bool]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.base + sum(count for count, _ in self.pods.values())

    def observe(self, uid: str, container_restarts: int, left: bool = False) -> bool:
        """Account for what was seen of one pod; True when anything changed."""
        count, was_left = self.pods.get(uid, (0, False))
        now = (max(count, container_restarts), was_left or left)
        if self.pods.get(uid) == now:
            return False
        self.pods[uid] = now
        return True

    def settle(self, present: set[str]) -> bool:
        """Close the account of the pods no longer there; True when anything changed."""
        gone = [uid for uid in self.pods if uid not in present]
        for uid in gone:
            count, left = self.pods.pop(uid)
            self.base += count + (0 if left else 1)
        return bool(gone)


def load_incarnations(annotation: str | None) -> dict[int, Incarnations]:
    if not annotation:
        return {}
    try:
        data = json.loads(annotation)
        return {int(k): Incarnations(int(v["base"]), {str(uid): (int(c), bool(left))
                                                      for uid, (c, left) in v["pods"].items()})
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


def pod_label(pod: PodView) -> str:
    """`<job>-<ordinal>` (the API's name of the pod), from `<job>-<ordinal>-<incarnation>`."""
    return pod.name.rsplit("-", 1)[0]


def give_up_reason(pods: list[PodView], restarts: dict[int, int], budget: int) -> str | None:
    """Why the job cannot go on (api/backends/policy.py): a pod that exited with the trainer's
    bad-input code, or one that used up the restart budget. None while its pods should keep
    being replaced."""
    for pod in pods:
        if bad_input(pod.exit_code):
            return bad_input_reason(pod_label(pod), last_line(pod.message), pod.exit_code)
    for pod in pods:
        used = restarts.get(pod.ordinal, 0)
        if over_budget(used, budget):
            return budget_spent_reason(pod_label(pod), used, pod.exit_code, pod.reason)
    return None
