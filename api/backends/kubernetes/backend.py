"""The Kubernetes backend: each job an anchor ConfigMap that owns its trainer pods, Secret,
NetworkPolicy, Services and coordinator.

The control plane is the trainer pods' controller: each status pass keeps the job's `replicas`
pods, one per ordinal, as a StatefulSet would, but pod by pod. That is what a StatefulSet cannot
do: a migration's replacement runs beside the pod it replaces (pods are
`<job>-<ordinal>-<incarnation>`, known to peers and reports as `<job>-<ordinal>`) on the node it
was sent to, and a pod that leaves is replaced at once instead of after its name is free.
Crashed containers restart in place (restartPolicy Always); while no control plane runs, a
deleted pod waits for the next one to replace it.

Objects come from the pure functions of anchor.py and the modules it draws on; pods are
observed through one pod watch (watch.py) and mapped by status.py. A foreground delete of the
anchor removes the pods first and nothing replaces them; the shared checkpoints and models PVCs
are not owned and stay.
Kubernetes errors keep their meaning: 404 -> WorkloadNotFound, 409 -> WorkloadConflict,
anything else -> BackendError, each naming namespace/name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from api.backends.base import (
    MIGRATION_TIMEOUT,
    BackendError,
    Launch,
    Moving,
    PlacementError,
    PodStatus,
    WorkloadConflict,
    WorkloadNotFound,
    WorkloadStatus,
)
from api.backends.kubernetes import anchor, labels, pods, template, volumes
from api.backends.kubernetes.cluster import ClusterConfig, Manifest
from api.backends.kubernetes.status import (
    Incarnations,
    PodView,
    dump_incarnations,
    give_up_reason,
    load_incarnations,
    view,
)
from api.backends.kubernetes.watch import PodWatcher
from api.settings import Settings

logger = logging.getLogger(__name__)

T = TypeVar("T")
REQUEST_TIMEOUT = 30.0
SYNC_WAIT = 2.0
"""Seconds a status call waits for the pod watch's first list before listing pods itself."""
MERGE_PATCH = "application/merge-patch+json"
EXPECT_SECONDS = 30.0
"""How long a created pod may take to show in the watch before it counts as not created."""


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
                         memory=settings.k8s_pod_memory, cache_size=settings.k8s_cache_size,
                         artifacts_secret=settings.k8s_artifacts_secret)


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
        self.watcher = PodWatcher(self.core, self.namespace, labels.ALL_TRAINERS,
                                  watch_timeout, key=ordinal_key)
        self._incarnations: dict[str, dict[int, Incarnations]] = {}
        self._creating: dict[str, dict[str, tuple[int, float]]] = {}
        """Per job, the pods created and not seen through the watch yet: (ordinal, monotonic
        deadline). A pass must not create a pod again because the watch lags behind."""
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
        owner = raw(f"create configmap {ns}/{job}", self.core.create_namespaced_config_map, ns,
                    anchor.anchor(launch, self.cluster))
        try:
            for manifest in anchor.dependents(launch, self.cluster):
                self._create(labels.owned_by(manifest, owner))
            with self._lock:
                for ordinal in range(launch.replicas):
                    self._create_pod(owner, ordinal, 0)
        except BackendError:
            # One delete of the owner takes whatever was created with it.
            self._delete_anchor(job)
            raise
        logger.info("job %s: %d pods created under %s/%s (%s)", job, launch.replicas, ns, job,
                    launch.fault_tolerance)

    def _create(self, manifest: Manifest) -> None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        creators: dict[str, Callable[..., Any]] = {
            "Secret": self.core.create_namespaced_secret,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            "Service": self.core.create_namespaced_service,
            "Deployment": self.apps.create_namespaced_deployment,
            "Pod": self.core.create_namespaced_pod}
        raw(f"create {kind.lower()} {self.namespace}/{name}", creators[kind], self.namespace,
            manifest)

    def _create_pod(self, owner: Manifest, ordinal: int, incarnation: int,
                    node: str | None = None, avoid: str | None = None,
                    replaces: int | None = None, gated: bool = False) -> None:
        template = json.loads(owner["data"][anchor.TEMPLATE_KEY])
        pod = pods.trainer_pod(template, owner, ordinal, incarnation, node=node,
                                    avoid=avoid, replaces=replaces, gated=gated)
        self._create(pod)
        self._creating.setdefault(owner["metadata"]["name"], {})[pod["metadata"]["name"]] = (
            ordinal, time.monotonic() + EXPECT_SECONDS)

    def _unseen(self, job_id: str, views: list[PodView]) -> set[int]:
        """The ordinals with a pod created that the watch has not shown yet."""
        seen, now = {v.name for v in views}, time.monotonic()
        creating = self._creating.get(job_id, {})
        for name in [n for n, (_, due) in creating.items() if n in seen or now > due]:
            del creating[name]
        return {ordinal for ordinal, _ in creating.values()}

    def _next_incarnation(self, owner: Manifest) -> int:
        """The next incarnation number of the job, recorded on its anchor first (a conflict
        with another writer fails the call: the next pass tries again)."""
        metadata = owner["metadata"]
        issued = int((metadata.get("annotations") or {}).get(anchor.ISSUED_ANNOTATION, 0))
        patch = {"metadata": {"resourceVersion": metadata["resourceVersion"], "annotations": {
            anchor.ISSUED_ANNOTATION: str(issued + 1)}}}
        updated = raw(f"patch configmap {self.namespace}/{metadata['name']}",
                      self.core.patch_namespaced_config_map, metadata["name"], self.namespace,
                      patch, _content_type=MERGE_PATCH)
        owner["metadata"] = updated["metadata"]
        return issued + 1

    def _link_volumes(self, launch: Launch) -> None:
        """Create the job's PVC sub-directories (so the pods' subPath mounts find them, owned by
        the same user) and link them where the API looks: <jobs dir>/<job>/{checkpoints,model}.
        Nothing to do when they go to an object store."""
        if volumes.in_store(launch):
            return
        assert isinstance(launch.checkpoint_dir, Path) and isinstance(launch.model_dir, Path)
        checkpoints, models = volumes.volume_dirs(self.volumes_dir, launch.job_id)
        links = {launch.checkpoint_dir: checkpoints,
                 launch.model_dir: volumes.exported_model_dir(models)}
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

    def status(self, job_id: str) -> WorkloadStatus:
        """The job's pods as the protocol sees them, after one pass of its controller: the
        control plane keeps `replicas` pods, as a StatefulSet would (`_control`)."""
        self._ensure_watch()
        try:
            owner = self._anchor(job_id)
        except WorkloadNotFound:
            return WorkloadStatus(present=False)
        replicas = int(owner["data"][anchor.REPLICAS_KEY])
        views = [v for v in map(view, self._pods(job_id)) if v is not None]
        restarts = self._count_restarts(owner, job_id, replicas, views)
        if owner["metadata"].get("deletionTimestamp"):
            # Being deleted (by a cancel or a completion that decided already): it is still
            # there, and calling it gone now would race that decision. Gone once deleted.
            return WorkloadStatus(present=True, pods=self._pod_statuses(job_id, replicas, views,
                                                                        restarts))
        reason = give_up_reason([v for v in views if v.ordinal < replicas and not v.deleting],
                                restarts, self.restart_budget)
        if reason is None:
            with self._lock:  # one pass at a time: two would both create a missing pod
                try:
                    self._control(owner, replicas, views)
                except BackendError as exc:  # the next pass starts from what is there then
                    logger.warning("job %s: pass of its pod controller broke off: %s", job_id,
                                   exc)
        return WorkloadStatus(present=reason is None, finished=reason is not None,
                              reason=reason,
                              pods=self._pod_statuses(job_id, replicas, views, restarts))

    def _anchor(self, job_id: str) -> Manifest:
        return raw(f"get configmap {self.namespace}/{job_id}",
                   self.core.read_namespaced_config_map, job_id, self.namespace)

    def _pods(self, job_id: str) -> list[dict[str, Any]]:
        if self.watcher.synced.wait(SYNC_WAIT):
            return self.watcher.pods(labels.JOB_LABEL, job_id)
        selector = labels.selector(labels.match_labels(job_id, labels.TRAINER))
        listing = raw(f"list pods {self.namespace} -l {selector}",
                      self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        pods: list[dict[str, Any]] = listing.get("items") or []
        self.watcher.remember(pods)
        return pods

    def _control(self, owner: Manifest, replicas: int, views: list[PodView]) -> None:
        """One pass of the job's controller over what the watch shows:
        - an ordinal at or above `replicas` is deleted with its grace (it leaves gracefully);
        - a pod that ended for good (evicted) is deleted, and an ordinal with no pod gets one:
          at once in a live job (it heals from a peer while the old one leaves), once the old
          one is gone in a restart job (two pods of one ordinal would both rendezvous);
        - a live migration's replacement that is ready takes over: the pod it replaces is
          deleted with its grace; one not ready within MIGRATION_TIMEOUT is deleted instead;
        - a restart-mode migration's replacement is let onto the scheduler once the pod it
          replaces is gone; one no node takes within MIGRATION_TIMEOUT is replaced by a pod
          that may go anywhere.
        """
        live = owner["data"].get(anchor.MODE_KEY) == "live"
        unseen = self._unseen(owner["metadata"]["name"], views)
        now = time.time()
        for pod in views:
            if pod.deleting:
                continue
            if pod.ordinal >= replicas:
                self._delete_pod(pod, template.TERMINATION_GRACE, "scaled away")
            elif pod.terminal:
                self._delete_pod(pod, 0, f"ended for good ({pod.reason or pod.phase})")
        for ordinal in range(replicas):
            if ordinal in unseen:
                continue  # what the watch shows of it is older than the pod just created
            current, surge = placed(views, ordinal)
            leaving = any(v.ordinal == ordinal and v.deleting for v in views)
            if current is None and surge is None and (live or not leaving):
                self._create_pod(owner, ordinal, self._next_incarnation(owner))
            elif current is not None and current.gated and surge is None and not leaving:
                self._lift_gate(current)
            elif (current is not None and current.replaces is not None and current.unschedulable
                  and now - (current.created or now) > MIGRATION_TIMEOUT):
                # A restart-mode migration to a node that cannot take it: start over anywhere.
                self._delete_pod(current, 0, f"not placed within {MIGRATION_TIMEOUT:.0f} s")
            elif surge is not None and current is not None:
                if surge.ready:
                    self._delete_pod(current, template.TERMINATION_GRACE,
                                     f"replaced by {surge.name}")
                elif now - (surge.created or now) > MIGRATION_TIMEOUT:
                    self._delete_pod(surge, 0, f"not ready within {MIGRATION_TIMEOUT:.0f} s")

    def _lift_gate(self, pod: PodView) -> None:
        call(f"patch pod {self.namespace}/{pod.name}", self.core.patch_namespaced_pod,
             pod.name, self.namespace, {"spec": {"schedulingGates": None}},
             _content_type=MERGE_PATCH, _preload_content=False)
        logger.info("pod %s: the pod it replaces is gone; it may be scheduled", pod.name)

    def _delete_pod(self, pod: PodView, grace: int, why: str) -> None:
        try:
            call(f"delete pod {self.namespace}/{pod.name}", self.core.delete_namespaced_pod,
                 pod.name, self.namespace, grace_period_seconds=grace, _preload_content=False)
        except WorkloadNotFound:
            return
        logger.info("pod %s deleted (grace %d s): %s", pod.name, grace, why)

    def _pod_statuses(self, job_id: str, replicas: int, views: list[PodView],
                      restarts: dict[int, int]) -> list[PodStatus]:
        return [self._pod_status(job_id, ordinal, shown(views, ordinal),
                                 placed(views, ordinal)[1], restarts[ordinal])
                for ordinal in range(replicas)]

    @staticmethod
    def _pod_status(job_id: str, ordinal: int, seen: PodView | None, surge: PodView | None,
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
                         reason="Terminating" if seen.deleting else seen.reason,
                         incarnation=str(seen.incarnation), migrating=surge is not None,
                         node=seen.node)

    def _count_restarts(self, owner: Manifest, job_id: str, replicas: int,
                        views: list[PodView]) -> dict[int, int]:
        """Restarts per ordinal (Incarnations); the tally lives on the anchor too, so a
        restarted control plane goes on from it."""
        annotation = (owner["metadata"].get("annotations") or {}).get(
            anchor.INCARNATIONS_ANNOTATION)
        with self._lock:
            tally = self._incarnations.setdefault(job_id, load_incarnations(annotation))
            ordinals = sorted(set(range(replicas)) | set(tally))
            taken, cached = self.watcher.take([f"{job_id}-{o}" for o in ordinals],
                                              labels.JOB_LABEL, job_id)
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
            patch = {"metadata": {"annotations": {anchor.INCARNATIONS_ANNOTATION: document}}}
            try:
                updated = raw(f"patch configmap {self.namespace}/{job_id}",
                              self.core.patch_namespaced_config_map, job_id, self.namespace,
                              patch, _content_type=MERGE_PATCH)
                owner["metadata"] = updated["metadata"]  # its new resourceVersion
            except BackendError as exc:  # counted in memory all the same; saved next time
                logger.warning("job %s: restart tally not saved: %s", job_id, exc)
        return totals

    # --- act ---------------------------------------------------------------------------

    def _running_anchor(self, job_id: str) -> Manifest:
        owner = self._anchor(job_id)
        if owner["metadata"].get("deletionTimestamp"):
            raise WorkloadNotFound(f"job {self.namespace}/{job_id} is being deleted")
        return owner

    def _current(self, job_id: str, ordinal: int) -> tuple[Manifest, PodView, PodView | None]:
        """The job's anchor, the pod that is `ordinal` now and its replacement if migrating."""
        owner = self._running_anchor(job_id)
        replicas = int(owner["data"][anchor.REPLICAS_KEY])
        if not 0 <= ordinal < replicas:
            raise WorkloadNotFound(f"job {self.namespace}/{job_id} has no pod {ordinal} "
                                   f"(replicas: {replicas})")
        views = [v for v in map(view, self._pods(job_id)) if v is not None]
        current, surge = placed(views, ordinal)
        with self._lock:
            unseen = ordinal in self._unseen(job_id, views)
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
                pods.kill_event(job_id, deleted, grace, ns, now))
        except BackendError as exc:  # the kill happened; the event is for `kubectl describe`
            logger.warning("job %s: kill event not recorded: %s", job_id, exc)

    def scale(self, job_id: str, replicas: int) -> None:
        """Record the pods asked for on the anchor; the next pass adds ordinals, or deletes
        the highest ones with their grace period (SIGTERM: each leaves gracefully)."""
        self._running_anchor(job_id)
        call(f"patch configmap {self.namespace}/{job_id}",
             self.core.patch_namespaced_config_map, job_id, self.namespace,
             {"data": {anchor.REPLICAS_KEY: str(replicas)}}, _content_type=MERGE_PATCH,
             _preload_content=False)
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
        live = owner["data"].get(anchor.MODE_KEY) == "live"
        with self._lock:  # not beside a controller pass
            incarnation = self._next_incarnation(owner)
            self._create_pod(owner, ordinal, incarnation, node=node,
                             avoid=current.node if node is None else None,
                             replaces=current.incarnation, gated=not live)
        if not live:
            self._delete_pod(current, template.TERMINATION_GRACE, "migrating")
        logger.info("job %s: pod %s-%d migrates from node %s to %s (incarnation %d)", job_id,
                    job_id, ordinal, current.node, node or "any other", incarnation)
        return Moving(incarnation=str(current.incarnation), node=current.node)

    def delete(self, job_id: str) -> None:
        if self._delete_anchor(job_id):
            logger.info("job %s: workload deleted (foreground)", job_id)
        with self._lock:
            self._incarnations.pop(job_id, None)
            self._creating.pop(job_id, None)
        self.watcher.forget(job_id)

    def _delete_anchor(self, job_id: str) -> bool:
        try:
            call(f"delete configmap {self.namespace}/{job_id}",
                 self.core.delete_namespaced_config_map, job_id, self.namespace,
                 propagation_policy="Foreground", _preload_content=False)
        except WorkloadNotFound:
            return False
        return True

    def tail_logs(self, job_id: str, ordinal: int, lines: int) -> list[str]:
        ns = self.namespace
        pod = shown([v for v in map(view, self._pods(job_id)) if v is not None], ordinal)
        if pod is None:
            return []
        text = ""
        for previous in (False, True):  # a crashed container's lines are in its previous run
            try:
                text = self.core.read_namespaced_pod_log(
                    pod.name, ns, container=labels.TRAINER, tail_lines=lines,
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
        listing = raw(f"list configmaps {self.namespace}",
                      self.core.list_namespaced_config_map, self.namespace,
                      label_selector=labels.ALL_TRAINERS)
        return sorted(item["metadata"]["name"] for item in listing.get("items") or []
                      if not item["metadata"].get("deletionTimestamp"))

    def gone(self, job_id: str) -> bool:
        try:
            self._anchor(job_id)
        except WorkloadNotFound:
            return True  # its pods went first: they block the anchor's foreground deletion
        return False


def ordinal_key(pod: dict[str, Any]) -> str | None:
    """`<job>-<ordinal>`: what the watch keeps a trainer pod's uids under (restarts are counted
    per ordinal, over all its pods)."""
    pod_labels = pod["metadata"].get("labels") or {}
    job, ordinal = pod_labels.get(labels.JOB_LABEL), pod_labels.get(labels.ORDINAL_LABEL)
    return f"{job}-{ordinal}" if job and ordinal else None


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
