"""The Kubernetes backend: each job a StatefulSet (plus Secret, NetworkPolicy, Services and its
coordinator).

Objects come from api/backends/manifests.py; pods are observed through one pod watch
(k8s_watch.py) and mapped by k8s_status.py. The StatefulSet owns everything else of a job, so a
foreground delete of it removes the pods first and nothing restarts; the shared checkpoints and
models PVCs are not owned and stay. Kubernetes errors keep their meaning: 404 -> WorkloadNotFound,
409 -> WorkloadConflict, anything else -> BackendError, each naming namespace/name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from api.backends import manifests
from api.backends.base import (
    BackendError,
    Launch,
    Moving,
    PodStatus,
    Unsupported,
    WorkloadConflict,
    WorkloadNotFound,
    WorkloadStatus,
)
from api.backends.k8s_status import (
    Incarnations,
    PodView,
    dump_incarnations,
    give_up_reason,
    load_incarnations,
    view,
)
from api.backends.k8s_watch import PodWatcher
from api.backends.manifests import ClusterConfig, Manifest
from api.settings import Settings

logger = logging.getLogger(__name__)

T = TypeVar("T")
REQUEST_TIMEOUT = 30.0
SYNC_WAIT = 2.0
"""Seconds a status call waits for the pod watch's first list before listing pods itself."""
MERGE_PATCH = "application/merge-patch+json"


def api_client(settings: Settings) -> client.ApiClient:
    """A client from the configured kubeconfig, else in-cluster, else $KUBECONFIG/~/.kube."""
    configuration = client.Configuration()
    try:
        if settings.k8s_kubeconfig is not None or settings.k8s_context is not None:
            config.load_kube_config(
                config_file=str(settings.k8s_kubeconfig) if settings.k8s_kubeconfig else None,
                context=settings.k8s_context, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise BackendError(f"no Kubernetes configuration: {exc}") from None
    return client.ApiClient(configuration)


def cluster_config(settings: Settings) -> ClusterConfig:
    return ClusterConfig(namespace=settings.k8s_namespace, image=settings.k8s_trainer_image,
                         image_pull_policy=settings.k8s_image_pull_policy,
                         data_claim=settings.k8s_data_claim,
                         checkpoints_claim=settings.k8s_checkpoints_claim,
                         models_claim=settings.k8s_models_claim, cpu=settings.k8s_pod_cpu,
                         memory=settings.k8s_pod_memory, cache_size=settings.k8s_cache_size)


def describe(exc: ApiException) -> str:
    """Status code, reason and the Status message; never the request (a Secret's data)."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(exc.body or "{}").get("message", "")
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")


def call(what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one API call; errors keep their status, wrapped with `what` (verb kind ns/name)."""
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    try:
        return function(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            raise WorkloadNotFound(f"{what}: {describe(exc)}") from None
        if exc.status == 409:
            raise WorkloadConflict(f"{what}: {describe(exc)}") from None
        raise BackendError(f"{what}: {describe(exc)}") from None
    except (HTTPError, OSError) as exc:
        raise BackendError(f"{what}: Kubernetes API unreachable ({exc})") from None


def raw(what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A call's JSON body as the server sent it (no model classes in between)."""
    response = call(what, function, *args, _preload_content=False, **kwargs)
    body: dict[str, Any] = json.loads(response.data)
    return body


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
        self.watcher = PodWatcher(self.core, self.namespace, manifests.ALL_TRAINERS,
                                  watch_timeout)
        self._incarnations: dict[str, dict[int, Incarnations]] = {}
        self._lock = threading.Lock()
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
        self.api.close()

    def _ensure_watch(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                self.watcher.start()

    # --- launch ------------------------------------------------------------------------

    def launch(self, launch: Launch) -> None:
        self._ensure_watch()
        self._link_volumes(launch)
        ns, job = self.namespace, launch.job_id
        body = manifests.statefulset(launch, self.cluster)
        owner = raw(f"create statefulset {ns}/{job}", self.apps.create_namespaced_stateful_set,
                    ns, body)
        try:
            for manifest in manifests.dependents(launch, self.cluster):
                self._create(manifests.owned_by(manifest, owner))
        except BackendError:
            # One delete of the owner takes whatever was created with it.
            self._delete_statefulset(job)
            raise
        logger.info("job %s: StatefulSet %s/%s created with %d pods (%s)", job, ns, job,
                    launch.replicas, launch.fault_tolerance)

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
        the same user) and link them where the API looks: <jobs dir>/<job>/{checkpoints,model}."""
        checkpoints, models = manifests.volume_dirs(self.volumes_dir, launch.job_id)
        links = {launch.checkpoint_dir: checkpoints,
                 launch.model_dir: manifests.exported_model_dir(models)}
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

    # --- observe -----------------------------------------------------------------------

    def status(self, job_id: str) -> WorkloadStatus:
        self._ensure_watch()
        ns = self.namespace
        try:
            owner = raw(f"get statefulset {ns}/{job_id}",
                        self.apps.read_namespaced_stateful_set, job_id, ns)
        except WorkloadNotFound:
            return WorkloadStatus(present=False)
        replicas = int(owner["spec"].get("replicas") or 0)
        views = {v.ordinal: v for v in map(view, self._pods(job_id)) if v is not None}
        restarts = self._count_restarts(owner, job_id, replicas)
        pods = [self._pod_status(job_id, ordinal, views.get(ordinal), restarts[ordinal])
                for ordinal in range(replicas)]
        if owner["metadata"].get("deletionTimestamp"):
            # Being deleted (by a cancel or a completion that decided already): it is still
            # there, and calling it gone now would race that decision. Gone once deleted.
            return WorkloadStatus(present=True, pods=pods)
        reason = give_up_reason([v for v in views.values() if v.ordinal < replicas],
                                restarts, self.restart_budget)
        return WorkloadStatus(present=reason is None, pods=pods, finished=reason is not None,
                              reason=reason)

    def _pods(self, job_id: str) -> list[dict[str, Any]]:
        if self.watcher.synced.wait(SYNC_WAIT):
            return self.watcher.pods(manifests.JOB_LABEL, job_id)
        selector = manifests.selector(manifests.match_labels(job_id, manifests.TRAINER))
        listing = raw(f"list pods {self.namespace} -l {selector}",
                      self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        pods: list[dict[str, Any]] = listing.get("items") or []
        self.watcher.remember(pods)
        return pods

    @staticmethod
    def _pod_status(job_id: str, ordinal: int, seen: PodView | None,
                    restarts: int) -> PodStatus:
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
                         reason="Terminating" if seen.deleting else seen.reason)

    def _count_restarts(self, owner: dict[str, Any], job_id: str,
                        replicas: int) -> dict[int, int]:
        """Restarts per ordinal: pods recreated (new uids) plus container restarts; the tally
        lives on the StatefulSet too, so a restarted control plane goes on from it."""
        annotation = (owner["metadata"].get("annotations") or {}).get(
            manifests.INCARNATIONS_ANNOTATION)
        with self._lock:
            tally = self._incarnations.setdefault(job_id, load_incarnations(annotation))
            changed = False
            for ordinal in range(replicas):
                counter = tally.setdefault(ordinal, Incarnations())
                for uid, seen in self.watcher.take_uids(f"{job_id}-{ordinal}"):
                    changed |= counter.observe(uid, seen.restarts, seen.left)
            totals = {ordinal: tally[ordinal].total for ordinal in range(replicas)}
            document = dump_incarnations(tally) if changed else None
        if document is not None and document != annotation:
            patch = {"metadata": {"annotations": {manifests.INCARNATIONS_ANNOTATION: document}}}
            try:
                call(f"patch statefulset {self.namespace}/{job_id}",
                     self.apps.patch_namespaced_stateful_set, job_id, self.namespace, patch,
                     _content_type=MERGE_PATCH)
            except BackendError as exc:  # counted in memory all the same; saved next time
                logger.warning("job %s: restart tally not saved: %s", job_id, exc)
        return totals

    # --- act ---------------------------------------------------------------------------

    def kill_pod(self, job_id: str, ordinal: int, grace_seconds: float) -> None:
        ns, name = self.namespace, f"{job_id}-{ordinal}"
        owner = raw(f"get statefulset {ns}/{job_id}", self.apps.read_namespaced_stateful_set,
                    job_id, ns)
        replicas = int(owner["spec"].get("replicas") or 0)
        if owner["metadata"].get("deletionTimestamp"):
            raise WorkloadNotFound(f"statefulset {ns}/{job_id} is being deleted")
        if not 0 <= ordinal < replicas:
            raise WorkloadNotFound(f"statefulset {ns}/{job_id} has no pod {ordinal} "
                                   f"(replicas: {replicas})")
        grace = max(0, math.ceil(grace_seconds))
        pod = raw(f"delete pod {ns}/{name}", self.core.delete_namespaced_pod, name, ns,
                  grace_period_seconds=grace)
        logger.info("job %s: pod %s deleted (grace %d s); its StatefulSet recreates it", job_id,
                    name, grace)
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        try:
            raw(f"create event {ns}/{name}", self.core.create_namespaced_event, ns,
                manifests.kill_event(job_id, pod, grace, ns, now))
        except BackendError as exc:  # the kill happened; the event is for `kubectl describe`
            logger.warning("job %s: kill event not recorded: %s", job_id, exc)

    def scale(self, job_id: str, replicas: int) -> None:
        """Patch the StatefulSet: its controller adds ordinals, or deletes the highest ones
        with their grace period (SIGTERM: each leaves gracefully)."""
        ns = self.namespace
        owner = raw(f"get statefulset {ns}/{job_id}", self.apps.read_namespaced_stateful_set,
                    job_id, ns)
        if owner["metadata"].get("deletionTimestamp"):
            raise WorkloadNotFound(f"statefulset {ns}/{job_id} is being deleted")
        call(f"scale statefulset {ns}/{job_id}", self.apps.patch_namespaced_stateful_set,
             job_id, ns, {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH)
        logger.info("job %s: statefulset scaled to %d", job_id, replicas)

    def migrate_pod(self, job_id: str, ordinal: int, node: str | None) -> Moving:
        raise Unsupported("moving a pod between nodes is not available on the kubernetes "
                          "backend yet: a StatefulSet cannot place one ordinal on a chosen "
                          "node; kill the pod with a grace instead (it leaves gracefully and "
                          "is recreated wherever the scheduler puts it)")

    def delete(self, job_id: str) -> None:
        if self._delete_statefulset(job_id):
            logger.info("job %s: workload deleted (foreground)", job_id)
        with self._lock:
            self._incarnations.pop(job_id, None)
        self.watcher.forget(job_id)

    def _delete_statefulset(self, job_id: str) -> bool:
        try:
            call(f"delete statefulset {self.namespace}/{job_id}",
                 self.apps.delete_namespaced_stateful_set, job_id, self.namespace,
                 propagation_policy="Foreground", _preload_content=False)
        except WorkloadNotFound:
            return False
        return True

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        ns, name = self.namespace, f"{job_id}-{ordinal}"
        text = ""
        for previous in (False, True):  # a crashed container's lines are in its previous run
            try:
                text = self.core.read_namespaced_pod_log(
                    name, ns, container=manifests.TRAINER, tail_lines=lines, previous=previous,
                    _request_timeout=REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status not in (400, 404):  # 400: no such run (yet); 404: no such pod
                    raise BackendError(f"logs of pod {ns}/{name}: {describe(exc)}") from None
                text = ""
            except (HTTPError, OSError) as exc:
                raise BackendError(f"logs of pod {ns}/{name}: Kubernetes API unreachable "
                                   f"({exc})") from None
            if text.strip():
                break
        return text.splitlines()[-lines:]

    def active_jobs(self) -> list[str]:
        listing = raw(f"list statefulsets {self.namespace}",
                      self.apps.list_namespaced_stateful_set, self.namespace,
                      label_selector=manifests.ALL_TRAINERS)
        return sorted(item["metadata"]["name"] for item in listing.get("items") or []
                      if not item["metadata"].get("deletionTimestamp"))
