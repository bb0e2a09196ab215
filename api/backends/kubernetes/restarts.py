"""Restarts per ordinal of each job, counted over all its pods from the pod watch and kept on
the job's anchor, so a restarted control plane goes on from the tally."""

from __future__ import annotations

import logging
import threading

from api.backends.base import BackendError
from api.backends.kubernetes.anchor import INCARNATIONS_ANNOTATION
from api.backends.kubernetes.anchor_state import Anchors
from api.backends.kubernetes.cluster import Manifest
from api.backends.kubernetes.labels import JOB_LABEL
from api.backends.kubernetes.status import (
    Incarnations,
    PodView,
    dump_incarnations,
    load_incarnations,
)
from api.backends.kubernetes.watch import PodWatcher

logger = logging.getLogger(__name__)


class RestartTally:
    """Each job's Incarnations per ordinal, in memory and on its anchor."""

    def __init__(self, watcher: PodWatcher, anchors: Anchors, lock: threading.Lock) -> None:
        self.watcher, self.anchors, self._lock = watcher, anchors, lock
        self._incarnations: dict[str, dict[int, Incarnations]] = {}

    def count(self, owner: Manifest, job_id: str, replicas: int,
              views: list[PodView]) -> dict[int, int]:
        """Restarts per ordinal (Incarnations); the tally lives on the anchor too, so a
        restarted control plane goes on from it."""
        annotation = (owner["metadata"].get("annotations") or {}).get(INCARNATIONS_ANNOTATION)
        with self._lock:
            tally = self._incarnations.get(job_id)
            if tally is None:  # read once: the anchor's copy is what this process wrote since
                tally = self._incarnations[job_id] = load_incarnations(annotation)
            ordinals = sorted(set(range(replicas)) | set(tally))
            taken, cached = self.watcher.take([f"{job_id}-{o}" for o in ordinals],
                                              JOB_LABEL, job_id)
            # Pods that are gone: not in the watch's cache as it was when the uids were taken
            # (a pod created since `views` is not gone), or, without a watch, not listed.
            present = cached if self.watcher.synced.is_set() else {pod.uid for pod in views}
            changed = False
            for ordinal in ordinals:
                counter = tally.setdefault(ordinal, Incarnations())
                for uid, seen in taken[f"{job_id}-{ordinal}"]:
                    changed |= counter.observe(uid, seen.restarts, seen.left)
                changed |= counter.settle(present)
            totals = {ordinal: tally[ordinal].total for ordinal in range(replicas)}
            document = dump_incarnations(tally) if changed else None
        if document is not None and document != annotation:
            try:
                self.anchors.save_incarnations(owner, job_id, document)
            except BackendError as exc:  # counted in memory all the same; saved next time
                logger.warning("job %s: restart tally not saved: %s", job_id, exc)
        return totals

    def totals(self, owner: Manifest, job_id: str, replicas: int) -> dict[int, int]:
        """Restarts per ordinal as last counted, without counting anything new: the tally in
        memory, else the one on the anchor (a control plane that has not counted yet)."""
        annotation = (owner["metadata"].get("annotations") or {}).get(INCARNATIONS_ANNOTATION)
        with self._lock:
            tally = self._incarnations.get(job_id)
            if tally is None:
                tally = load_incarnations(annotation)
            return {ordinal: tally[ordinal].total if ordinal in tally else 0
                    for ordinal in range(replicas)}

    def forget(self, job_id: str) -> None:
        """Drop the job's tally (with the lock held)."""
        self._incarnations.pop(job_id, None)
