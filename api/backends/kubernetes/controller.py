"""The trainer pods' controller: each pass keeps a job's `replicas` pods, one per ordinal, as a
StatefulSet would, but pod by pod.

That is what a StatefulSet cannot do: a migration's replacement runs beside the pod it replaces
(pods are `<job>-<ordinal>-<incarnation>`, known to peers and reports as `<job>-<ordinal>`) on the
node it was sent to, and a pod that leaves is replaced at once instead of after its name is free.
"""

from __future__ import annotations

import json
import logging
import time

from kubernetes import client

from api.backends.base import MIGRATION_TIMEOUT, WorkloadNotFound
from api.backends.kubernetes.anchor import MODE_KEY, TEMPLATE_KEY
from api.backends.kubernetes.anchor_state import Anchors
from api.backends.kubernetes.calls import MERGE_PATCH, call, raw
from api.backends.kubernetes.cluster import Manifest
from api.backends.kubernetes.pods import trainer_pod
from api.backends.kubernetes.status import PodView
from api.backends.kubernetes.template import TERMINATION_GRACE

logger = logging.getLogger(__name__)

EXPECT_SECONDS = 30.0
"""How long a created pod may take to show in the watch before it counts as not created."""


class PodController:
    """Creates, lets onto the scheduler and deletes the trainer pods of one namespace. Its
    callers hold the backend's lock: two passes at once would both create a missing pod."""

    def __init__(self, core: client.CoreV1Api, namespace: str, anchors: Anchors,
                 migration_timeout: float = MIGRATION_TIMEOUT) -> None:
        self.core, self.namespace, self.anchors = core, namespace, anchors
        self.migration_timeout = migration_timeout
        """How long a migration's replacement may take to be placed, or to be ready."""
        self._creating: dict[str, dict[str, tuple[int, float]]] = {}
        """Per job, the pods created and not seen through the watch yet: (ordinal, monotonic
        deadline). A pass must not create a pod again because the watch lags behind."""

    def create_pod(self, owner: Manifest, ordinal: int, incarnation: int,
                   node: str | None = None, avoid: str | None = None,
                   replaces: int | None = None, gated: bool = False) -> None:
        template = json.loads(owner["data"][TEMPLATE_KEY])
        pod = trainer_pod(template, owner, ordinal, incarnation, node=node, avoid=avoid,
                          replaces=replaces, gated=gated)
        name = pod["metadata"]["name"]
        raw(f"create pod {self.namespace}/{name}", self.core.create_namespaced_pod,
            self.namespace, pod)
        self._creating.setdefault(owner["metadata"]["name"], {})[name] = (
            ordinal, time.monotonic() + EXPECT_SECONDS)

    def unseen(self, job_id: str, views: list[PodView]) -> set[int]:
        """The ordinals with a pod created that the watch has not shown yet."""
        seen, now = {v.name for v in views}, time.monotonic()
        creating = self._creating.get(job_id, {})
        for name in [n for n, (_, due) in creating.items() if n in seen or now > due]:
            del creating[name]
        return {ordinal for ordinal, _ in creating.values()}

    def forget(self, job_id: str) -> None:
        self._creating.pop(job_id, None)

    def reconcile(self, owner: Manifest, replicas: int, views: list[PodView]) -> None:
        """One pass of the job's controller over what the watch shows:
        - an ordinal at or above `replicas` is deleted with its grace (it leaves gracefully);
        - a pod that ended for good (evicted) is deleted, and an ordinal with no pod gets one:
          at once in a live job (it heals from a peer while the old one leaves), once the old
          one is gone in a restart job (two pods of one ordinal would both rendezvous);
        - a live migration's replacement that is ready takes over: the pod it replaces is
          deleted with its grace; one not ready within `migration_timeout` is deleted instead;
        - a restart-mode migration's replacement is let onto the scheduler once the pod it
          replaces is gone; one no node takes within `migration_timeout` is replaced by a pod
          that may go anywhere.
        """
        live = owner["data"].get(MODE_KEY) == "live"
        unseen = self.unseen(owner["metadata"]["name"], views)
        now = time.time()
        for pod in views:
            if pod.deleting:
                continue
            if pod.ordinal >= replicas:
                self.delete_pod(pod, TERMINATION_GRACE, "scaled away")
            elif pod.terminal:
                self.delete_pod(pod, 0, f"ended for good ({pod.reason or pod.phase})")
        for ordinal in range(replicas):
            if ordinal in unseen:
                continue  # what the watch shows of it is older than the pod just created
            current, surge = placed(views, ordinal)
            leaving = any(v.ordinal == ordinal and v.deleting for v in views)
            if current is None and surge is None and (live or not leaving):
                self.create_pod(owner, ordinal, self.anchors.next_incarnation(owner))
            elif current is not None and current.gated and surge is None and not leaving:
                self.lift_gate(current)
            elif (current is not None and current.replaces is not None and current.unschedulable
                  and now - (current.created or now) > self.migration_timeout):
                # A restart-mode migration to a node that cannot take it: start over anywhere.
                self.delete_pod(current, 0, f"not placed within {self.migration_timeout:.0f} s")
            elif surge is not None and current is not None:
                if surge.ready:
                    self.delete_pod(current, TERMINATION_GRACE, f"replaced by {surge.name}")
                elif now - (surge.created or now) > self.migration_timeout:
                    self.delete_pod(surge, 0, f"not ready within {self.migration_timeout:.0f} s")

    def lift_gate(self, pod: PodView) -> None:
        call(f"patch pod {self.namespace}/{pod.name}", self.core.patch_namespaced_pod,
             pod.name, self.namespace, {"spec": {"schedulingGates": None}},
             _content_type=MERGE_PATCH, _preload_content=False)
        logger.info("pod %s: the pod it replaces is gone; it may be scheduled", pod.name)

    def delete_pod(self, pod: PodView, grace: int, why: str) -> None:
        try:
            call(f"delete pod {self.namespace}/{pod.name}", self.core.delete_namespaced_pod,
                 pod.name, self.namespace, grace_period_seconds=grace, _preload_content=False)
        except WorkloadNotFound:
            return
        logger.info("pod %s deleted (grace %d s): %s", pod.name, grace, why)


def placed(views: list[PodView], ordinal: int) -> tuple[PodView | None, PodView | None]:
    """The pod that is `ordinal` now (its newest that is neither being deleted nor ended for
    good) and a migration's replacement running beside it (one whose `replaces` names that
    pod), if any."""
    alive = [v for v in views if v.ordinal == ordinal and not v.deleting and not v.terminal]
    incarnations = {v.incarnation for v in alive}
    surges = [v for v in alive if v.replaces is not None and v.replaces in incarnations]
    current = max((v for v in alive if v not in surges), key=lambda v: v.incarnation,
                  default=None)
    return current, (surges[0] if surges else None)


def shown(views: list[PodView], ordinal: int) -> PodView | None:
    """The pod that stands for `ordinal` in its status: the current one, else the newest that
    is on its way out (a pod leaving before its replacement exists)."""
    current, _ = placed(views, ordinal)
    going = [v for v in views if v.ordinal == ordinal]
    return current or max(going, key=lambda v: v.incarnation, default=None)
