"""What marks an object as a job's: its labels and owner, so that one label selector finds a
job's pods and one finds every job of this control plane, and one delete of the job's anchor
takes everything it owns."""

from __future__ import annotations

from api.backends.kubernetes.cluster import Manifest

APP = "live-migrator"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
PART_OF_LABEL = "app.kubernetes.io/part-of"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "live-migrator-api"
JOB_LABEL = "live-migrator.io/job"
ORDINAL_LABEL = "live-migrator.io/ordinal"
"""A trainer pod's ordinal: its identity in the job (`<job>-<ordinal>`), kept by its
replacements."""
INCARNATION_LABEL = "live-migrator.io/incarnation"
"""Which life of its ordinal a trainer pod is: unique in the job, higher for later pods."""
REPLACES_LABEL = "live-migrator.io/replaces"
"""On a migration's replacement: the incarnation it replaces once it takes part."""
REPLICA_LABEL = "live-migrator.io/replica"
STAGE_LABEL = "live-migrator.io/stage"
"""A trainer pod's place in the job: its replica and, in a pipeline job, the stage it holds
(pod o is stage o % stages of replica o // stages; a data-parallel pod is stage 0)."""
STAGING_LABEL = "live-migrator.io/staging"
"""On an initializer Job and its pod: the staging it runs (one per hub repository and
revision, shared by every job that names it, so it carries no job label)."""
TRAINER, LIGHTHOUSE, STORE = "trainer", "lighthouse", "store"
INITIALIZER = "initializer"


def labels(job_id: str, component: str) -> dict[str, str]:
    return {NAME_LABEL: APP, INSTANCE_LABEL: job_id, COMPONENT_LABEL: component,
            PART_OF_LABEL: APP, MANAGED_BY_LABEL: MANAGED_BY, JOB_LABEL: job_id}


def staging_labels(staging_id: str) -> dict[str, str]:
    """An initializer's: its own component, which the namespace's policy for initializers
    selects (k8s/base/network-policy.yaml) and no policy of trainers does."""
    return {NAME_LABEL: APP, INSTANCE_LABEL: staging_id, COMPONENT_LABEL: INITIALIZER,
            PART_OF_LABEL: APP, MANAGED_BY_LABEL: MANAGED_BY, STAGING_LABEL: staging_id}


def match_labels(job_id: str, component: str) -> dict[str, str]:
    return {JOB_LABEL: job_id, COMPONENT_LABEL: component}


def selector(values: dict[str, str]) -> str:
    """A label selector string for equality on every item."""
    return ",".join(f"{key}={value}" for key, value in values.items())


ALL_TRAINERS = selector({MANAGED_BY_LABEL: MANAGED_BY, COMPONENT_LABEL: TRAINER})
"""Every job's trainer pods (the pod watch) and anchors (re-adoption)."""


def metadata(name: str, job_id: str, component: str, namespace: str) -> Manifest:
    return {"name": name, "namespace": namespace, "labels": labels(job_id, component)}


def owner_reference(owner: Manifest) -> Manifest:
    """A reference to a created object (its uid is the server's), for cascading deletion."""
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "blockOwnerDeletion": True}


def owned_by(manifest: Manifest, owner: Manifest) -> Manifest:
    metadata = {**manifest["metadata"], "ownerReferences": [owner_reference(owner)]}
    return {**manifest, "metadata": metadata}
