"""The Kubernetes backend: each job an anchor ConfigMap that owns its trainer pods, Secret,
NetworkPolicy, Services and coordinator.

The control plane is the trainer pods' controller (controller.py): each `reconcile` pass keeps
the job's `replicas` pods, one per ordinal; `status` only reads. Crashed containers restart in
place (restartPolicy Always); while no control plane runs, a deleted pod waits for the next one
to replace it.

Objects come from the pure functions of anchor.py and the modules it draws on; pods and
anchors are observed through watch caches (informer.py; the pods' is watch.py, the anchors' is
in anchor_state.py), so a pass over a quiet job makes no request; pods are mapped by status.py;
what the control plane records on a job's anchor goes through anchor_state.py and restarts.py.
A foreground delete of the anchor removes the pods first and nothing replaces them; the shared
checkpoints and models PVCs are not owned and stay. API errors keep their meaning (calls.py).
Hub repositories are staged by an initializer Job each (initializers.py), owned by no job.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from api.backends.base import (
    BackendError,
    Launch,
    Moving,
    PlacementError,
    PodStatus,
    StagingRequest,
    WorkloadConflict,
    WorkloadNotFound,
    WorkloadStatus,
)
from api.backends.kubernetes.anchor import MODE_KEY, REPLICAS_KEY, anchor, dependents
from api.backends.kubernetes.anchor_state import Anchors
from api.backends.kubernetes.calls import REQUEST_TIMEOUT, api_client, describe, raw
from api.backends.kubernetes.cluster import ClusterConfig, Manifest
from api.backends.kubernetes.controller import PodController, placed, shown
from api.backends.kubernetes.initializer_job import pod_request
from api.backends.kubernetes.initializers import Initializers
from api.backends.kubernetes.labels import (
    ALL_TRAINERS,
    JOB_LABEL,
    ORDINAL_LABEL,
    TRAINER,
    match_labels,
    owned_by,
    selector,
)
from api.backends.kubernetes.pods import kill_event
from api.backends.kubernetes.restarts import RestartTally
from api.backends.kubernetes.status import PodView, give_up_reason, view
from api.backends.kubernetes.template import TERMINATION_GRACE
from api.backends.kubernetes.volumes import exported_model_dir, in_store, volume_dirs
from api.backends.kubernetes.watch import PodWatcher
from api.settings import Settings

logger = logging.getLogger(__name__)


def cluster_config(settings: Settings) -> ClusterConfig:
    return ClusterConfig(namespace=settings.k8s_namespace, image=settings.k8s_trainer_image,
                         image_pull_policy=settings.k8s_image_pull_policy,
                         data_claim=settings.k8s_data_claim,
                         checkpoints_claim=settings.k8s_checkpoints_claim,
                         models_claim=settings.k8s_models_claim, cpu=settings.k8s_pod_cpu,
                         memory=settings.k8s_pod_memory, cache_size=settings.k8s_cache_size,
                         artifacts_secret=settings.k8s_artifacts_secret,
                         hub_endpoint=settings.k8s_hub_endpoint,
                         hub_token_secret=settings.k8s_hub_token_secret)


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, api: client.ApiClient, cluster: ClusterConfig, volumes_dir: Path,
                 restart_budget: int, watch_timeout: int = 300) -> None:
        self.api, self.cluster = api, cluster
        self.namespace = cluster.namespace
        self.volumes_dir = volumes_dir
        self.restart_budget = restart_budget
        self.core, self.apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self.networking = client.NetworkingV1Api(api)
        self.initializers = Initializers(client.BatchV1Api(api), cluster)
        self.watcher = PodWatcher(self.core, self.namespace, ALL_TRAINERS,
                                  watch_timeout, key=ordinal_key)
        self._lock = threading.Lock()
        """One controller pass at a time, beside no migration or tally update."""
        self.anchors = Anchors(self.core, self.namespace, watch_timeout)
        self.controller = PodController(self.core, self.namespace, self.anchors)
        self.restarts = RestartTally(self.watcher, self.anchors, self._lock)
        self._started = False

    @classmethod
    def from_settings(cls, settings: Settings) -> KubernetesBackend:
        volumes = settings.resolved_volumes_dir
        if not volumes.is_relative_to(settings.data_dir.resolve()):
            # Registered models are stored as paths relative to the data dir.
            raise BackendError(f"MIGRATOR_K8S_VOLUMES_DIR {volumes} is not inside the data dir")
        return cls(api_client(settings), cluster_config(settings), volumes,
                   settings.restart_budget, settings.k8s_watch_timeout)

    def close(self) -> None:
        self.watcher.stop()
        self.anchors.stop()
        self.api.close()

    def _ensure_watch(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                self.watcher.start()
                self.anchors.start()

    # --- launch ------------------------------------------------------------------------

    def launch(self, launch: Launch) -> None:
        self._ensure_watch()
        self._link_volumes(launch)
        ns, job = self.namespace, launch.job_id
        owner = self.anchors.create(anchor(launch, self.cluster))
        try:
            for manifest in dependents(launch, self.cluster):
                self._create(owned_by(manifest, owner))
            with self._lock:
                for ordinal in range(launch.pods):
                    self.controller.create_pod(owner, ordinal, 0)
        except BackendError:
            # One delete of the owner takes whatever was created with it.
            self.anchors.delete(job)
            raise
        logger.info("job %s: %d pods created under %s/%s (%s)", job, launch.pods, ns, job,
                    launch.fault_tolerance)

    def _create(self, manifest: Manifest) -> None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        creators: dict[str, Callable[..., Any]] = {
            "Secret": self.core.create_namespaced_secret,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            "Service": self.core.create_namespaced_service,
            "Deployment": self.apps.create_namespaced_deployment}
        raw(f"create {kind.lower()} {self.namespace}/{name}", creators[kind], self.namespace,
            manifest)

    def _link_volumes(self, launch: Launch) -> None:
        """Create the job's PVC sub-directories (so the pods' subPath mounts find them, owned by
        the same user) and link them where the API looks: <jobs dir>/<job>/{checkpoints,model}.
        Nothing to do when they go to an object store."""
        if in_store(launch):
            return
        assert isinstance(launch.checkpoint_dir, Path) and isinstance(launch.model_dir, Path)
        checkpoints, models = volume_dirs(self.volumes_dir, launch.job_id)
        links = {launch.checkpoint_dir: checkpoints,
                 launch.model_dir: exported_model_dir(models)}
        try:
            for directory in (checkpoints, models):
                directory.mkdir(parents=True, exist_ok=True)
            for link, target in links.items():
                link.parent.mkdir(parents=True, exist_ok=True)
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(target, target_is_directory=True)
        except OSError as exc:
            raise BackendError(f"cannot prepare the volumes of {launch.job_id}: {exc}") from None

    # --- observe and control ------------------------------------------------------------

    def reconcile(self, job_id: str) -> None:
        """One pass of the job's controller: count its restarts (kept on its anchor), then,
        unless the job is being deleted or its restart budget is spent, keep its `replicas`
        pods, as a StatefulSet would (PodController)."""
        observed = self._observe(job_id)
        if observed is None:
            return
        owner, replicas, views = observed
        restarts = self.restarts.count(owner, job_id, replicas, views)
        if owner["metadata"].get("deletionTimestamp") or self._give_up_reason(
                replicas, views, restarts) is not None:
            return
        with self._lock:  # one pass at a time: two would both create a missing pod
            try:
                self.controller.reconcile(owner, replicas, views)
            except BackendError as exc:  # the next pass starts from what is there then
                logger.warning("job %s: pass of its pod controller broke off: %s", job_id, exc)

    def status(self, job_id: str) -> WorkloadStatus:
        """The job's pods as the protocol sees them, with the restarts its last `reconcile`
        counted; creates, patches and deletes nothing."""
        observed = self._observe(job_id)
        if observed is None:
            return WorkloadStatus(present=False)
        owner, replicas, views = observed
        restarts = self.restarts.totals(owner, job_id, replicas)
        pods = pod_statuses(job_id, replicas, views, restarts)
        if owner["metadata"].get("deletionTimestamp"):
            # Being deleted (by a cancel or a completion that decided already): it is still
            # there, and calling it gone now would race that decision. Gone once deleted.
            return WorkloadStatus(present=True, pods=pods)
        reason = self._give_up_reason(replicas, views, restarts)
        return WorkloadStatus(present=reason is None, finished=reason is not None,
                              reason=reason, pods=pods)

    def _observe(self, job_id: str) -> tuple[Manifest, int, list[PodView]] | None:
        """The job's anchor, its pods asked for and their views, from the watch caches; None
        where it has no anchor."""
        self._ensure_watch()
        try:
            owner = self.anchors.get(job_id)
        except WorkloadNotFound:
            return None
        return owner, int(owner["data"][REPLICAS_KEY]), self._views(job_id)

    def _give_up_reason(self, replicas: int, views: list[PodView],
                        restarts: dict[int, int]) -> str | None:
        return give_up_reason([v for v in views if v.ordinal < replicas and not v.deleting],
                              restarts, self.restart_budget)

    def _pods(self, job_id: str) -> list[dict[str, Any]]:
        if self.watcher.wait_synced():
            return self.watcher.pods(JOB_LABEL, job_id)
        pods_of_job = selector(match_labels(job_id, TRAINER))
        listing = raw(f"list pods {self.namespace} -l {pods_of_job}",
                      self.core.list_namespaced_pod, self.namespace, label_selector=pods_of_job)
        pods: list[dict[str, Any]] = listing.get("items") or []
        self.watcher.remember(pods)
        return pods

    def _views(self, job_id: str) -> list[PodView]:
        return [v for v in map(view, self._pods(job_id)) if v is not None]

    # --- act ---------------------------------------------------------------------------

    def _current(self, job_id: str, ordinal: int) -> tuple[Manifest, PodView, PodView | None]:
        """The job's anchor, the pod that is `ordinal` now and its replacement if migrating."""
        owner = self.anchors.running(job_id)
        replicas = int(owner["data"][REPLICAS_KEY])
        if not 0 <= ordinal < replicas:
            raise WorkloadNotFound(f"job {self.namespace}/{job_id} has no pod {ordinal} "
                                   f"(replicas: {replicas})")
        views = self._views(job_id)
        current, surge = placed(views, ordinal)
        with self._lock:
            unseen = ordinal in self.controller.unseen(job_id, views)
        if current is None:
            raise WorkloadConflict(f"pod {job_id}-{ordinal} is being replaced")
        if unseen:  # a replacement just created beside it: a migration's
            raise WorkloadConflict(f"pod {job_id}-{ordinal} is already migrating")
        return owner, current, surge

    def kill_pod(self, job_id: str, ordinal: int, grace_seconds: float) -> None:
        _, pod, _ = self._current(job_id, ordinal)
        grace = max(0, math.ceil(grace_seconds))
        ns = self.namespace
        deleted = raw(f"delete pod {ns}/{pod.name}", self.core.delete_namespaced_pod, pod.name,
                      ns, grace_period_seconds=grace)
        logger.info("job %s: pod %s deleted (grace %d s); it is replaced", job_id, pod.name,
                    grace)
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        try:
            raw(f"create event {ns}/{pod.name}", self.core.create_namespaced_event, ns,
                kill_event(job_id, deleted, grace, ns, now))
        except BackendError as exc:  # the kill happened; the event is for `kubectl describe`
            logger.warning("job %s: kill event not recorded: %s", job_id, exc)

    def scale(self, job_id: str, replicas: int) -> None:
        """Record the pods asked for on the anchor; the next pass adds ordinals, or deletes
        the highest ones with their grace period (SIGTERM: each leaves gracefully)."""
        self.anchors.running(job_id)
        self.anchors.set_replicas(job_id, replicas)
        logger.info("job %s: scaled to %d pods", job_id, replicas)

    def migrate_pod(self, job_id: str, ordinal: int, node: str | None) -> Moving:
        """Start the pod's replacement on `node` (else on any node but the pod's). Live: it
        heals from a peer beside the pod, and once ready (it participates in a step) the pod is
        deleted with its grace and leaves gracefully. Restart mode: the pod is deleted with
        its grace now (an emergency checkpoint) and its replacement, created held off the
        scheduler, is let on once the pod is gone, to start from that checkpoint."""
        owner, current, surge = self._current(job_id, ordinal)
        if surge is not None or current.gated:
            raise WorkloadConflict(f"pod {job_id}-{ordinal} is already migrating")
        if node is not None and node == current.node:
            raise PlacementError(f"pod {job_id}-{ordinal} already runs on node {node}")
        live = owner["data"].get(MODE_KEY) == "live"
        with self._lock:  # not beside a controller pass
            incarnation = self.anchors.next_incarnation(owner)
            self.controller.create_pod(owner, ordinal, incarnation, node=node,
                                       avoid=current.node if node is None else None,
                                       replaces=current.incarnation, gated=not live)
        if not live:
            self.controller.delete_pod(current, TERMINATION_GRACE, "migrating")
        logger.info("job %s: pod %s-%d migrates from node %s to %s (incarnation %d)", job_id,
                    job_id, ordinal, current.node, node or "any other", incarnation)
        return Moving(incarnation=str(current.incarnation), node=current.node)

    def delete(self, job_id: str) -> None:
        if self.anchors.delete(job_id):
            logger.info("job %s: workload deleted (foreground)", job_id)
        with self._lock:
            self.restarts.forget(job_id)
            self.controller.forget(job_id)
        self.watcher.forget(job_id)

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        ns = self.namespace
        pod = shown(self._views(job_id), ordinal)
        if pod is None:
            return []
        text = ""
        for previous in (False, True):  # a crashed container's lines are in its previous run
            try:
                text = self.core.read_namespaced_pod_log(
                    pod.name, ns, container=TRAINER, tail_lines=lines,
                    previous=previous, _request_timeout=REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status not in (400, 404):  # 400: no such run (yet); 404: no such pod
                    raise BackendError(f"logs of pod {ns}/{pod.name}: {describe(exc)}") from None
                text = ""
            except (HTTPError, OSError) as exc:
                raise BackendError(f"logs of pod {ns}/{pod.name}: Kubernetes API unreachable "
                                   f"({exc})") from None
            if text.strip():
                break
        return text.splitlines()[-lines:]

    def active_jobs(self) -> list[str]:
        self._ensure_watch()
        return self.anchors.active()

    def stage(self, request: StagingRequest) -> None:
        self.initializers.start(pod_request(request, self.volumes_dir))

    def staging(self, staging_id: str) -> bool:
        return self.initializers.running(staging_id)

    def gone(self, job_id: str) -> bool:
        self._ensure_watch()
        try:
            self.anchors.get(job_id)
        except WorkloadNotFound:
            return True  # its pods went first: they block the anchor's foreground deletion
        return False


def ordinal_key(pod: dict[str, Any]) -> str | None:
    """`<job>-<ordinal>`: what the watch keeps a trainer pod's uids under (restarts are counted
    per ordinal, over all its pods)."""
    pod_labels = pod["metadata"].get("labels") or {}
    job, ordinal = pod_labels.get(JOB_LABEL), pod_labels.get(ORDINAL_LABEL)
    return f"{job}-{ordinal}" if job and ordinal else None


def pod_statuses(job_id: str, replicas: int, views: list[PodView],
                 restarts: dict[int, int]) -> list[PodStatus]:
    return [pod_status(job_id, ordinal, shown(views, ordinal), placed(views, ordinal)[1],
                       restarts[ordinal])
            for ordinal in range(replicas)]


def pod_status(job_id: str, ordinal: int, seen: PodView | None, surge: PodView | None,
               restarts: int) -> PodStatus:
    """How the protocol sees ordinal `ordinal`: `seen` stands for it (`shown`), `surge` is its
    migration's replacement."""
    name = f"{job_id}-{ordinal}"
    if seen is None:  # deleted, not recreated yet
        return PodStatus(ordinal, name, "Pending", restarts)
    phase = seen.phase
    if seen.deleting and seen.graceful and phase in ("Running", "Succeeded"):
        # SIGTERM: it commits its step and leaves (exit 0), then it is recreated.
        phase = "Running" if phase == "Running" else "Pending"
    elif seen.deleting and phase == "Running":
        phase = "Failed"
    return PodStatus(ordinal=ordinal, name=name, phase=phase, restarts=restarts,
                     started_at=seen.started_at, exit_code=seen.exit_code,
                     reason="Terminating" if seen.deleting else seen.reason,
                     incarnation=str(seen.incarnation), migrating=surge is not None,
                     node=seen.node)
