"""The jobs' anchors as the API server holds them: what the control plane reads from and records
on each job's ConfigMap (api/backends/kubernetes/anchor.py makes it)."""

from __future__ import annotations

from kubernetes import client

from api.backends.base import WorkloadNotFound
from api.backends.kubernetes.anchor import (
    INCARNATIONS_ANNOTATION,
    ISSUED_ANNOTATION,
    REPLICAS_KEY,
)
from api.backends.kubernetes.calls import MERGE_PATCH, call, raw
from api.backends.kubernetes.cluster import Manifest
from api.backends.kubernetes.labels import ALL_TRAINERS


class Anchors:
    """The anchor ConfigMaps of one namespace."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace

    def create(self, manifest: Manifest) -> Manifest:
        """Create a job's anchor; as created, with the uid its dependents are owned by."""
        name = manifest["metadata"]["name"]
        return raw(f"create configmap {self.namespace}/{name}",
                   self.core.create_namespaced_config_map, self.namespace, manifest)

    def get(self, job_id: str) -> Manifest:
        return raw(f"get configmap {self.namespace}/{job_id}",
                   self.core.read_namespaced_config_map, job_id, self.namespace)

    def running(self, job_id: str) -> Manifest:
        """The job's anchor, unless it is being deleted (WorkloadNotFound then)."""
        owner = self.get(job_id)
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
        updated = raw(f"patch configmap {self.namespace}/{metadata['name']}",
                      self.core.patch_namespaced_config_map, metadata["name"], self.namespace,
                      patch, _content_type=MERGE_PATCH)
        owner["metadata"] = updated["metadata"]
        return issued + 1

    def save_incarnations(self, owner: Manifest, job_id: str, document: str) -> None:
        """Record the job's restart tally (status.dump_incarnations) on its anchor."""
        patch = {"metadata": {"annotations": {INCARNATIONS_ANNOTATION: document}}}
        updated = raw(f"patch configmap {self.namespace}/{job_id}",
                      self.core.patch_namespaced_config_map, job_id, self.namespace,
                      patch, _content_type=MERGE_PATCH)
        owner["metadata"] = updated["metadata"]  # its new resourceVersion

    def set_replicas(self, job_id: str, replicas: int) -> None:
        call(f"patch configmap {self.namespace}/{job_id}",
             self.core.patch_namespaced_config_map, job_id, self.namespace,
             {"data": {REPLICAS_KEY: str(replicas)}}, _content_type=MERGE_PATCH,
             _preload_content=False)

    def delete(self, job_id: str) -> bool:
        """Delete the anchor in the foreground (its pods go first); whether there was one."""
        try:
            call(f"delete configmap {self.namespace}/{job_id}",
                 self.core.delete_namespaced_config_map, job_id, self.namespace,
                 propagation_policy="Foreground", _preload_content=False)
        except WorkloadNotFound:
            return False
        return True

    def active(self) -> list[str]:
        """The jobs whose anchors are there and not being deleted."""
        listing = raw(f"list configmaps {self.namespace}",
                      self.core.list_namespaced_config_map, self.namespace,
                      label_selector=ALL_TRAINERS)
        return sorted(item["metadata"]["name"] for item in listing.get("items") or []
                      if not item["metadata"].get("deletionTimestamp"))
