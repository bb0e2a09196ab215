"""A job's coordinator, the lighthouse (live) or the rendezvous store (restart), and the
Service its pods reach it through."""

from __future__ import annotations

from pathlib import PurePosixPath

from api.backends.base import Launch
from api.backends.kubernetes.cluster import (
    ClusterConfig,
    Manifest,
    container_security,
    pod_ip_env,
    pod_security,
)
from api.backends.kubernetes.labels import LIGHTHOUSE, STORE, labels, match_labels, metadata
from api.backends.kubernetes.secret import secret_env
from api.backends.programs import (
    LIGHTHOUSE_PORT,
    STORE_PORT,
    Endpoint,
    coordinator_env,
    lighthouse_argv,
    store_argv,
)

STORE_STATE = PurePosixPath("/tmp/store.json")
"""Where the rendezvous store keeps its keys: on its pod's emptyDir, which outlives a restart
of its container (a crash, an OOM kill), so the store comes back with the rendezvous it held
instead of leaving every agent to wait out its read timeout and fail."""


def coordinator_name(launch: Launch) -> str:
    return f"{launch.job_id}-{coordinator_component(launch)}"


def coordinator_component(launch: Launch) -> str:
    return LIGHTHOUSE if launch.fault_tolerance == "live" else STORE


def coordinator_endpoint(launch: Launch) -> Endpoint:
    """How pods reach their lighthouse or rendezvous store: its Service's name in the namespace."""
    port = LIGHTHOUSE_PORT if launch.fault_tolerance == "live" else STORE_PORT
    return Endpoint(coordinator_name(launch), port)


def coordinator_deployment(launch: Launch, config: ClusterConfig) -> Manifest:
    """The lighthouse (live) or the rendezvous store (restart): one pod, never two at once,
    listening on its pod IP like every process of a job."""
    job, component = launch.job_id, coordinator_component(launch)
    endpoint = coordinator_endpoint(launch)
    # The kubelet expands $(POD_IP), an IPv4 or IPv6 address: each program joins it to its port.
    argv = (lighthouse_argv("$(POD_IP)", endpoint.port, launch.spec.replicas)
            if component == LIGHTHOUSE
            else store_argv(endpoint.port, host="$(POD_IP)", state_file=STORE_STATE))
    container = {
        "name": component, "image": config.image, "imagePullPolicy": config.image_pull_policy,
        "command": argv,
        "ports": [{"name": component, "containerPort": endpoint.port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": component}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                      "limits": {"memory": "1Gi"}},
        "env": [pod_ip_env(), {"name": "HOME", "value": "/tmp"},
                *(secret_env(launch, name) for name in coordinator_env(launch))],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": container_security(),
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": metadata(endpoint.host, job, component, config.namespace),
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": match_labels(job, component)},
            "template": {
                "metadata": {"labels": labels(job, component)},
                "spec": {"automountServiceAccountToken": False, "enableServiceLinks": False,
                         "securityContext": pod_security(), "containers": [container],
                         "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]},
            },
        },
    }


def coordinator_service(launch: Launch, config: ClusterConfig) -> Manifest:
    job, component = launch.job_id, coordinator_component(launch)
    endpoint = coordinator_endpoint(launch)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(endpoint.host, job, component, config.namespace),
            "spec": {"selector": match_labels(job, component),
                     "ports": [{"name": component, "port": endpoint.port,
                                "targetPort": component, "protocol": "TCP"}]}}
