"""How a job's trainer pods find and reach each other, and who else may: its headless Service
and its NetworkPolicy."""

from __future__ import annotations

from api.backends.base import Launch
from api.backends.kubernetes.cluster import ClusterConfig, Manifest
from api.backends.kubernetes.labels import JOB_LABEL, TRAINER, match_labels, metadata


def network_policy(launch: Launch, config: ClusterConfig) -> Manifest:
    """Only the job's own trainers reach its pods: heals, collectives, stores, its coordinator.

    The namespace's policies (k8s/base/network-policy.yaml) let no pod in and leave the rest to
    this one: policies add up, so a namespace-wide allow would let other jobs in too.
    """
    job = launch.job_id
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(job, job, TRAINER, config.namespace),
            "spec": {"podSelector": {"matchLabels": {JOB_LABEL: job}},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {
                         "matchLabels": match_labels(job, TRAINER)}}]}]}}


def headless_service(launch: Launch, config: ClusterConfig) -> Manifest:
    """The pods' subdomain: stable DNS names `<job>-<ordinal>.<job>` for the pods."""
    job = launch.job_id
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(job, job, TRAINER, config.namespace),
            "spec": {"clusterIP": "None", "selector": match_labels(job, TRAINER),
                     # Peers must find a pod that is starting or healing, before it is ready.
                     "publishNotReadyAddresses": True}}
