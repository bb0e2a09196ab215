"""The jobs' anchors as the API server holds them: what the control plane reads from and records
on each job's ConfigMap (api/backends/kubernetes/anchor.py makes it).

Reads come from a watch cache of the anchors (informer.py), so a pass over a job whose anchor
did not change asks the server nothing; the control plane's own writes go into that cache from
the server's answer, so the next read sees them even while the watch lags. What an action
(kill, scale, migrate) starts from is read from the server itself (`running`).
"""

from __future__ import annotations

from kubernetes import client

from api.backends.base import WorkloadNotFound
from api.backends.kubernetes.anchor import (
    INCARNATIONS_ANNOTATION,
    ISSUED_ANNOTATION,
    REPLICAS_KEY,
)
from api.backends.kubernetes.calls import MERGE_PATCH, raw
from api.backends.kubernetes.cluster import Manifest
from api.backends.kubernetes.informer import Informer
from api.backends.kubernetes.labels import ALL_TRAINERS


class Anchors:
    """The anchor ConfigMaps of one namespace."""

    def __init__(self, core: client.CoreV1Api, namespace: str, watch_timeout: int) -> None:
        self.core, self.namespace = core, namespace
        self.cache = Informer(core.list_namespaced_config_map, "ConfigMap", namespace,
                              ALL_TRAINERS, watch_timeout)

    def start(self) -> None:
        self.cache.start()

    def stop(self) -> None:
        self.cache.stop()

    def create(self, manifest: Manifest) -> Manifest:
        """Create a job's anchor; as created, with the uid its dependents are owned by."""
        name = manifest["metadata"]["name"]
        return self._wrote(raw(f"create configmap {self.namespace}/{name}",
                               self.core.create_namespaced_config_map, self.namespace,
                               manifest))

    def get(self, job_id: str) -> Manifest:
        """The job's anchor as the watch shows it with our writes since (no request), or as
        the server holds it while the watch is not in sync."""
        if not self.cache.wait_synced():
            return self.read(job_id)
        owner = self.cache.get(job_id)
        if owner is None:
            raise WorkloadNotFound(f"configmap {self.namespace}/{job_id}: not found")
        return owner

    def read(self, job_id: str) -> Manifest:
        """The job's anchor as the server holds it now."""
        return self._wrote(raw(f"get configmap {self.namespace}/{job_id}",
                               self.core.read_namespaced_config_map, job_id, self.namespace))

    def running(self, job_id: str) -> Manifest:
        """The job's anchor as the server holds it now (an action starts from there), unless
        it is being deleted (WorkloadNotFound then)."""
        owner = self.read(job_id)
        if owner["metadata"].get("deletionTimestamp"):
            raise WorkloadNotFound(f"job {self.namespace}/{job_id} is being deleted")
        return owner

    def next_incarnation(self, owner: Manifest) -> int:
        """The next incarnation number of the job, recorded on its anchor first (a conflict
        with another writer fails the call: the next pass tries again)."""
        metadata = owner["metadata"]
        issued = int((metadata.get("annotations") or {}).get(ISSUED_ANNOTATION, 0))
        patch = {"metadata": {"resourceVersion": metadata["resourceVersion"], "annotations": {
            ISSUED_ANNOTATION: str(issued + 1)}}}
        updated = self._wrote(raw(f"patch configmap {self.namespace}/{metadata['name']}",
                                  self.core.patch_namespaced_config_map, metadata["name"],
                                  self.namespace, patch, _content_type=MERGE_PATCH))
        owner["metadata"] = updated["metadata"]
        return issued + 1

    def save_incarnations(self, owner: Manifest, job_id: str, document: str) -> None:
        """Record the job's restart tally (status.dump_incarnations) on its anchor."""
        patch = {"metadata": {"annotations": {INCARNATIONS_ANNOTATION: document}}}
        updated = self._wrote(raw(f"patch configmap {self.namespace}/{job_id}",
                                  self.core.patch_namespaced_config_map, job_id, self.namespace,
                                  patch, _content_type=MERGE_PATCH))
        owner["metadata"] = updated["metadata"]  # its new resourceVersion

    def set_replicas(self, job_id: str, replicas: int) -> None:
        self._wrote(raw(f"patch configmap {self.namespace}/{job_id}",
                        self.core.patch_namespaced_config_map, job_id, self.namespace,
                        {"data": {REPLICAS_KEY: str(replicas)}}, _content_type=MERGE_PATCH))

    def delete(self, job_id: str) -> bool:
        """Delete the anchor in the foreground (its pods go first); whether there was one."""
        try:
            deleting = raw(f"delete configmap {self.namespace}/{job_id}",
                           self.core.delete_namespaced_config_map, job_id, self.namespace,
                           propagation_policy="Foreground")
        except WorkloadNotFound:
            return False
        if deleting.get("kind") == "ConfigMap":  # marked for deletion (else a Status: gone)
            self._wrote(deleting)
        return True

    def active(self) -> list[str]:
        """The jobs whose anchors are there and not being deleted."""
        if self.cache.wait_synced():
            items = self.cache.items()
        else:
            items = raw(f"list configmaps {self.namespace}",
                        self.core.list_namespaced_config_map, self.namespace,
                        label_selector=ALL_TRAINERS).get("items") or []
        return sorted(item["metadata"]["name"] for item in items
                      if not item["metadata"].get("deletionTimestamp"))

    def _wrote(self, owner: Manifest) -> Manifest:
        """`owner` as the server answered us, kept in the cache too (the watch may lag)."""
        self.cache.write(owner)
        return owner
