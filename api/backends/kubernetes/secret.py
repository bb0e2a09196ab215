"""The job's Secret, and the environment variables its pods and coordinator take from it: the
report token and the peer secret never appear as literals in a manifest."""

from __future__ import annotations

from api.backends.base import Launch
from api.backends.kubernetes.cluster import ClusterConfig, Manifest
from api.backends.kubernetes.labels import TRAINER, metadata
from trainer.contract.runtime import Runtime

REPORT_TOKEN_KEY = "report-token"
PEER_SECRET_KEY = "peer-secret"
SECRET_KEYS = {Runtime.env_name("report_token"): REPORT_TOKEN_KEY,
               Runtime.env_name("peer_secret"): PEER_SECRET_KEY}
"""The trainer's environment variables whose values come from the job's Secret, by key."""


def secret_name(job_id: str) -> str:
    return f"{job_id}-report"


def secret_env(launch: Launch, name: str) -> Manifest:
    """The environment variable `name`, filled from the job's Secret by the kubelet (its store
    credential is keyed by its variable's name)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {
        "name": secret_name(launch.job_id), "key": SECRET_KEYS.get(name, name)}}}


def secret(launch: Launch, config: ClusterConfig) -> Manifest:
    """The job's secrets: its report token, the peer secret its pods and coordinator prove to
    each other, and its own store credential if it has one (keyed by variable)."""
    data = {REPORT_TOKEN_KEY: launch.report_token, PEER_SECRET_KEY: launch.peer_secret,
            **launch.store_env}
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": metadata(secret_name(launch.job_id), launch.job_id, TRAINER,
                                 config.namespace),
            "type": "Opaque", "immutable": True, "stringData": data}
