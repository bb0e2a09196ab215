"""The trainer pods' informer (informer.py): a list-then-watch cache of every trainer pod.

Besides the current pods it keeps, per key (the backend's is the ordinal's `<job>-<n>`), every
uid it saw since the last `take` with that pod's highest container restart count and whether it
left gracefully, so a pod deleted and recreated between two looks is still counted (or not,
when it left).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from api.backends.kubernetes.informer import Informer
from api.backends.kubernetes.labels import JOB_LABEL

HISTORY = 32
"""Uids remembered per pod name (far more than can happen between two status calls)."""

Pod = dict[str, Any]


@dataclass(frozen=True)
class Seen:
    """What the watch saw of one pod uid."""

    restarts: int
    """Its highest container restart count."""
    left: bool
    """It was being deleted and its container ended with exit code 0: a trainer that left
    gracefully on the deletion's SIGTERM. Counted as no restart."""


def restart_count(pod: Pod) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return max((int(s.get("restartCount", 0)) for s in statuses), default=0)


def left_gracefully(pod: Pod) -> bool:
    """Whether the pod is being deleted and every container of it ended with exit code 0."""
    if not pod["metadata"].get("deletionTimestamp"):
        return False
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    ended = [(s.get("state") or {}).get("terminated") for s in statuses]
    return bool(ended) and all(e is not None and e.get("exitCode") == 0 for e in ended)


class PodWatcher(Informer):
    def __init__(self, core: client.CoreV1Api, namespace: str, label_selector: str,
                 timeout_seconds: int, key: Callable[[Pod], str | None]) -> None:
        super().__init__(core.list_namespaced_pod, "Pod", namespace, label_selector,
                         timeout_seconds, index=JOB_LABEL)
        self.key = key
        """What a pod's uids are kept under (None: not kept)."""
        self._uids: dict[str, OrderedDict[str, Seen]] = {}

    def pods(self, label: str, value: str) -> list[Pod]:
        """Current pods whose label `label` is `value`."""
        return self.items(label, value)

    def take(self, keys: list[str], label: str, value: str,
             ) -> tuple[dict[str, list[tuple[str, Seen]]], set[str]]:
        """Every uid seen under each key since the last call and what was seen of it (oldest
        first, each handed out once), and the uids of the current pods whose label `label` is
        `value`, at one instant: a uid handed out is current or its pod was deleted."""
        with self._lock:
            taken = {key: list(self._uids.pop(key, {}).items()) for key in keys}
            present = {pod["metadata"].get("uid", "") for pod in self._matching(label, value)}
        return taken, present

    def forget(self, job_id: str) -> None:
        """Drop the uids kept for a job's pods (its workload is gone)."""
        with self._lock:
            for name in [n for n in self._uids if n.rsplit("-", 1)[0] == job_id]:
                del self._uids[name]

    def remember(self, pods: list[Pod]) -> None:
        """Record pods listed directly (while the watch is not synced)."""
        with self._lock:
            for pod in pods:
                self._observed(pod)

    def _observed(self, pod: Pod) -> None:
        key, uid = self.key(pod), pod["metadata"].get("uid", "")
        if key is None:
            return
        seen = self._uids.setdefault(key, OrderedDict())
        before = seen.get(uid, Seen(0, False))
        seen[uid] = Seen(max(before.restarts, restart_count(pod)),
                         before.left or left_gracefully(pod))
        while len(seen) > HISTORY:
            seen.popitem(last=False)
