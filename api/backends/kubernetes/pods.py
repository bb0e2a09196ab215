"""One trainer pod of a job, made from the template on its anchor, and the Event that tells who
killed one."""

from __future__ import annotations

import json

from api.backends.kubernetes.anchor import MODE_KEY, STAGES_KEY
from api.backends.kubernetes.cluster import Manifest
from api.backends.kubernetes.labels import (
    INCARNATION_LABEL,
    MANAGED_BY,
    ORDINAL_LABEL,
    REPLACES_LABEL,
    REPLICA_LABEL,
    STAGE_LABEL,
    TRAINER,
    labels,
    owner_reference,
)
from api.backends.kubernetes.template import identity_env
from api.backends.programs import REPLICA_STORE_PORT
from trainer.contract.runtime import Runtime

HOSTNAME_LABEL = "kubernetes.io/hostname"
PLACEMENT_GATE = "live-migrator.io/replaced-first"
"""Holds a restart-mode migration's replacement off the scheduler until the pod it replaces
is gone (two pods of one ordinal cannot share a restart-mode job)."""


def pod_name(job_id: str, ordinal: int, incarnation: int) -> str:
    return f"{job_id}-{ordinal}-{incarnation}"


def trainer_pod(template: Manifest, owner: Manifest, ordinal: int, incarnation: int,
                node: str | None = None, avoid: str | None = None,
                replaces: int | None = None, gated: bool = False) -> Manifest:
    """One trainer pod of the job `owner` anchors: `<job>-<ordinal>-<incarnation>`, known to
    its peers and in its reports as `<job>-<ordinal>` (DNS `<job>-<ordinal>.<job>` too).
    `node` places it there, `avoid` anywhere but there; `replaces`: a migration's; `gated`: it
    is not scheduled until the control plane lifts its gate (PLACEMENT_GATE)."""
    job, namespace = owner["metadata"]["name"], owner["metadata"]["namespace"]
    spec = json.loads(json.dumps(template["spec"]))  # a deep copy
    spec["hostname"] = f"{job}-{ordinal}"
    container = spec["containers"][0]
    identity = identity_env(job, ordinal, incarnation)
    stages = int(owner["data"].get(STAGES_KEY, "1"))
    if stages > 1 and owner["data"].get(MODE_KEY) == "live":
        # The replica's stages meet at its stage 0, found through the job's headless Service.
        first = ordinal // stages * stages
        identity.append({"name": Runtime.env_name("replica_store"),
                         "value": f"{job}-{first}.{job}:{REPLICA_STORE_PORT}"})
    container["env"] = [container["env"][0], *identity,
                        *container["env"][1:]]  # after POD_IP, which later values expand
    if node is not None or avoid is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": HOSTNAME_LABEL, "operator": "In" if node is not None else "NotIn",
                "values": [node if node is not None else avoid]}]}]}}}
    if gated:
        spec["schedulingGates"] = [{"name": PLACEMENT_GATE}]
    pod_labels = {**template["metadata"]["labels"], ORDINAL_LABEL: str(ordinal),
                  INCARNATION_LABEL: str(incarnation), REPLICA_LABEL: str(ordinal // stages),
                  STAGE_LABEL: str(ordinal % stages)}
    if replaces is not None:
        pod_labels[REPLACES_LABEL] = str(replaces)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(job, ordinal, incarnation), "namespace": namespace,
                         "labels": pod_labels,
                         "ownerReferences": [{**owner_reference(owner), "controller": True}]},
            "spec": spec}


def kill_event(job_id: str, pod: Manifest, grace_seconds: int, namespace: str,
               time: str) -> Manifest:
    """A Kubernetes Event on the pod, so `kubectl describe pod` tells who killed it."""
    name = pod["metadata"]["name"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace,
                         "labels": labels(job_id, TRAINER)},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name,
                               "namespace": namespace, "uid": pod["metadata"]["uid"]},
            "reason": "FailureInjected", "type": "Warning",
            "message": f"deleted by the control plane on request (grace {grace_seconds} s)",
            "source": {"component": MANAGED_BY}, "firstTimestamp": time,
            "lastTimestamp": time, "count": 1}
