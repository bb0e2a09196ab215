"""The Kubernetes backend's initializers: one Job per staging (initializer_job.py), created
once and read back with one GET per reconcile pass while its staging runs.

The Job, not this process, is the initializer's record: a restarted control plane finds the one
its predecessor created, still running or finished. The outcome is in the initializer's
progress file on the data volume (api.services.staging reads it); the Job says only whether it
still runs.
"""

from __future__ import annotations

import contextlib
import logging

from kubernetes import client

from api.backends.base import BackendError, StagingRequest, WorkloadConflict, WorkloadNotFound
from api.backends.kubernetes.calls import raw
from api.backends.kubernetes.cluster import ClusterConfig, Manifest
from api.backends.kubernetes.initializer_job import finished, initializer_job, job_name

logger = logging.getLogger(__name__)


class Initializers:
    def __init__(self, batch: client.BatchV1Api, cluster: ClusterConfig) -> None:
        self.batch, self.cluster = batch, cluster
        self.namespace = cluster.namespace

    def start(self, request: StagingRequest) -> None:
        """Create the staging's Job unless one runs: a 409 on create means one is there, and
        one that finished (a failed staging, tried again) is deleted and created anew."""
        manifest = initializer_job(request, self.cluster)
        name = manifest["metadata"]["name"]
        try:
            self._create(request, manifest)
            return
        except WorkloadConflict:
            existing = self._read(name)
        if existing is not None and not finished(existing):
            logger.info("staging %s: its initializer Job %s/%s runs already", request.staging_id,
                        self.namespace, name)
            return
        if existing is not None and not existing["metadata"].get("deletionTimestamp"):
            # Background: the Job goes now, its ended pod after it (a Job's default would
            # orphan the pod). Not found: its time to live ran out meanwhile.
            with contextlib.suppress(WorkloadNotFound):
                raw(f"delete job {self.namespace}/{name}", self.batch.delete_namespaced_job,
                    name, self.namespace, propagation_policy="Background")
        try:
            self._create(request, manifest)
        except WorkloadConflict:  # still being deleted, or created anew by another
            logger.info("staging %s: Job %s/%s is still there; the next pass looks again",
                        request.staging_id, self.namespace, name)

    def running(self, staging_id: str) -> bool:
        """Whether the staging's Job exists and has not finished. One GET; where the API
        server cannot answer, it is taken as running, and the next pass asks again."""
        try:
            job = self._read(job_name(staging_id))
        except BackendError as exc:
            logger.warning("staging %s: its Job cannot be read (%s); taken as running",
                           staging_id, exc)
            return True
        return job is not None and not finished(job)

    def _create(self, request: StagingRequest, manifest: Manifest) -> None:
        name = manifest["metadata"]["name"]
        raw(f"create job {self.namespace}/{name}", self.batch.create_namespaced_job,
            self.namespace, manifest)
        logger.info("staging %s: initializer Job %s/%s created for %s %s@%s",
                    request.staging_id, self.namespace, name, request.kind, request.repo_id,
                    request.revision)

    def _read(self, name: str) -> Manifest | None:
        try:
            return raw(f"get job {self.namespace}/{name}", self.batch.read_namespaced_job, name,
                       self.namespace)
        except WorkloadNotFound:
            return None
