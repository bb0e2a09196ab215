"""The cluster-side settings a job's objects share, and what every pod of a job runs as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Manifest = dict[str, Any]

USER_ID = 10001
"""The non-root user of both images (Dockerfile.api, Dockerfile.trainer) and of every pod, the
API's (k8s/base/api.yaml) too: files are created private (PRIVATE_UMASK), so the API reads what
the trainers write on the shared volumes only as their user."""


@dataclass(frozen=True)
class ClusterConfig:
    """The cluster-side settings every job's objects share (from api.settings.Settings)."""

    namespace: str
    image: str
    image_pull_policy: str = "IfNotPresent"
    data_claim: str = "migrator-data"
    checkpoints_claim: str = "migrator-checkpoints"
    models_claim: str = "migrator-models"
    cpu: str = "2"
    """Default CPU request and limit of a trainer pod."""
    memory: str = "6Gi"
    """Default memory request and limit of a trainer pod."""
    cache_size: str = "8Gi"
    artifacts_secret: str | None = None
    """A Secret whose keys become every trainer pod's environment: the artifacts store's
    credentials (AZURE_STORAGE_CONNECTION_STRING, or AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_ENDPOINT_URL), when checkpoints and models go to an object store."""
    hub_endpoint: str | None = None
    """The Hugging Face hub (or a mirror) that initializers fetch from
    (MIGRATOR_K8S_HUB_ENDPOINT, else the API's own HF_ENDPOINT); the hub's default when unset."""
    hub_token_secret: str | None = None
    """A Secret whose key HF_TOKEN initializer pods get as HF_TOKEN (gated or private
    repositories); trainer pods never get it."""


def container_security() -> Manifest:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def pod_security() -> Manifest:
    return {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID,
            "fsGroup": USER_ID, "seccompProfile": {"type": "RuntimeDefault"}}


def pod_ip_env() -> Manifest:
    """The pod's IP from the downward API; listed first, `$(POD_IP)` expands after it."""
    return {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
