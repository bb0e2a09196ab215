"""A job's anchor, the ConfigMap that is its record in the cluster and owns every other object
of it, and those objects in the order they are created."""

from __future__ import annotations

import json

from api.backends.base import Launch
from api.backends.kubernetes.cluster import ClusterConfig, Manifest
from api.backends.kubernetes.coordinator import coordinator_deployment, coordinator_service
from api.backends.kubernetes.labels import TRAINER, metadata
from api.backends.kubernetes.network import headless_service, network_policy
from api.backends.kubernetes.secret import secret
from api.backends.kubernetes.template import pod_template

INCARNATIONS_ANNOTATION = "live-migrator.io/incarnations"
"""On the job's anchor: per ordinal, the pod uid last seen and the restarts counted so far, so a
restarted control plane goes on counting where the last one stopped."""
ISSUED_ANNOTATION = "live-migrator.io/issued"
"""On the job's anchor: the highest incarnation number given to a pod."""
REPLICAS_KEY = "replicas"
STAGES_KEY = "stages"
MODE_KEY = "fault-tolerance"
TEMPLATE_KEY = "pod-template"
"""The anchor's data: the pods asked for, the pods per replica (a pipeline's stages), and the
pod every one of them is made from."""


def anchor(launch: Launch, config: ClusterConfig) -> Manifest:
    """The job's record in the cluster, which owns every other object of it: the pods asked
    for and the pod template (data), the restart tally and the incarnations given out
    (annotations). The control plane makes and replaces the pods from it, as a StatefulSet
    would, but one pod at a time: a migration's replacement runs beside the pod it replaces,
    on the node it was sent to."""
    job = launch.job_id
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {**metadata(job, job, TRAINER, config.namespace),
                         "annotations": {ISSUED_ANNOTATION: "0"}},
            "data": {REPLICAS_KEY: str(launch.pods),
                     STAGES_KEY: str(launch.spec.stages), MODE_KEY: launch.fault_tolerance,
                     TEMPLATE_KEY: json.dumps(pod_template(launch, config),
                                              separators=(",", ":"))}}


def dependents(launch: Launch, config: ClusterConfig) -> list[Manifest]:
    """Everything the anchor owns besides the pods, in creation order (the pods' Secret and
    NetworkPolicy first: the pods wait for the one and cannot reach each other without the
    other)."""
    return [secret(launch, config), network_policy(launch, config),
            headless_service(launch, config), coordinator_deployment(launch, config),
            coordinator_service(launch, config)]
