"""What every trainer pod of a job is made from: its container, environment, probe and volumes.

What the container runs comes from api/backends/programs.py, as on the local backend; only the
addresses differ: a pod's own IP comes from the downward API (`$(POD_IP)`, expanded by the
kubelet) and is the only address its processes listen on, the coordinator is reached through its
Service, and the report token and peer secret come from the job's Secret.
"""

from __future__ import annotations

import math
from pathlib import Path

from api.backends.base import Launch
from api.backends.kubernetes.cluster import (
    ClusterConfig,
    Manifest,
    container_security,
    pod_ip_env,
    pod_security,
)
from api.backends.kubernetes.coordinator import coordinator_endpoint
from api.backends.kubernetes.labels import TRAINER, labels
from api.backends.kubernetes.secret import SECRET_KEYS, secret_env
from api.backends.kubernetes.volumes import (
    CACHE_MOUNT,
    CHECKPOINTS_MOUNT,
    INPUTS_MOUNT,
    MODELS_MOUNT,
    in_store,
    pod_launch,
)
from api.backends.programs import pod_argv, pod_env
from trainer.contract.runtime import Runtime

POD_NAME = Runtime.env_name("pod_name")
READY_FILE_ENV = Runtime.env_name("ready_file")
HEARTBEAT_FILE_ENV = Runtime.env_name("heartbeat_file")
READY_FILE = "/tmp/trainer-ready"
HEARTBEAT_FILE = "/tmp/trainer-heartbeat"
HEARTBEAT_MAX_AGE = 60
"""Seconds without a report record after which a trainer pod counts as not ready."""
HEARTBEAT_MAX_AGE_ENV = "HEARTBEAT_MAX_AGE"
"""The variable that tells the readiness probe HEARTBEAT_MAX_AGE (the probe's alone)."""
TERMINATION_GRACE = 30
"""Seconds a deleted trainer pod gets to write its emergency checkpoint (the trainer's SIGTERM)."""

# A trainer pod must restart (restartPolicy Always), but a trainer that finished must not
# run again: it would retrain from an older checkpoint and overwrite the export the control plane
# is registering. So the container's first process runs the trainer as a child, forwards
# SIGTERM/SIGINT to it (its emergency checkpoint), passes any failure or a stop on, and after a
# clean finish holds the pod until the control plane deletes the workload.
# (No "$(" in here: the kubelet would expand it.)
HOLD_SCRIPT = """\
"$@" &
child=$!
stopped=
trap 'stopped=1; kill -TERM "$child" 2>/dev/null' TERM INT
while :; do
  wait "$child"; code=$?
  kill -0 "$child" 2>/dev/null || break
done
if [ "$code" -ne 0 ] || [ -n "$stopped" ]; then exit "$code"; fi
echo "trainer finished: holding the pod until the control plane deletes the workload" >&2
trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM INT
while :; do sleep 3600 & sleeper=$!; wait "$sleeper"; done
"""
# The probe finds the files through the variables the trainer reads them from (its Runtime).
HEARTBEAT_CHECK = ("import os, sys, time; "
                   f"os.stat(os.environ[{READY_FILE_ENV!r}]); "
                   f"sys.exit(time.time() - os.stat(os.environ[{HEARTBEAT_FILE_ENV!r}]).st_mtime"
                   f" > float(os.environ[{HEARTBEAT_MAX_AGE_ENV!r}]))")


def trainer_resources(launch: Launch, config: ClusterConfig) -> Manifest:
    """Requests equal limits (Guaranteed QoS: a training pod is the last one evicted)."""
    wanted = launch.resources
    cpu = (wanted.cpu if wanted and wanted.cpu else None) or config.cpu
    memory = (wanted.memory if wanted and wanted.memory else None) or config.memory
    limits = {"cpu": cpu, "memory": memory}
    if wanted and wanted.gpus:
        limits["nvidia.com/gpu"] = str(wanted.gpus)
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}


def cpu_count(quantity: str) -> int:
    """Whole CPUs in a quantity (`500m` -> 1, `2` -> 2, `2.5` -> 3): the pod's thread count."""
    value = float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    return max(1, math.ceil(value))


IDENTITY = (POD_NAME, "POD_ORDINAL", Runtime.env_name("incarnation"))
"""The variables that make a pod of the template one pod (`identity_env`)."""


def identity_env(job_id: str, ordinal: int, incarnation: int) -> list[Manifest]:
    return [{"name": POD_NAME, "value": f"{job_id}-{ordinal}"},
            {"name": "POD_ORDINAL", "value": str(ordinal)},
            {"name": Runtime.env_name("incarnation"), "value": str(incarnation)}]


def trainer_env(launch: Launch, config: ClusterConfig) -> list[Manifest]:
    """pod_env() with the pod's IP from the downward API and the job's secrets (report token,
    peer secret, store credential) from its Secret, never as literals in the manifest; each pod
    adds its identity (`identity_env`)."""
    cpu = trainer_resources(launch, config)["limits"]["cpu"]
    values = pod_env(pod_launch(launch), pod_name="", coordinator=coordinator_endpoint(launch),
                     pod_address="$(POD_IP)", threads=cpu_count(cpu),
                     ready_file=Path(READY_FILE))
    env: list[Manifest] = [pod_ip_env()]
    for name, value in values.items():
        if name in IDENTITY:
            continue  # each pod's own
        env.append(secret_env(launch, name) if name in SECRET_KEYS or name in launch.store_env
                   else {"name": name, "value": value})
    env += [{"name": "HF_HOME", "value": str(CACHE_MOUNT / "huggingface")},
            {"name": "HOME", "value": "/tmp"},
            {"name": HEARTBEAT_FILE_ENV, "value": HEARTBEAT_FILE},
            {"name": HEARTBEAT_MAX_AGE_ENV, "value": str(HEARTBEAT_MAX_AGE)}]
    return env


def trainer_container(launch: Launch, config: ClusterConfig) -> Manifest:
    argv = pod_argv(pod_launch(launch), coordinator_endpoint(launch), local_addr="$(POD_IP)")
    artifacts = [] if in_store(launch) else [
        {"name": "checkpoints", "mountPath": str(CHECKPOINTS_MOUNT), "subPath": launch.job_id},
        {"name": "models", "mountPath": str(MODELS_MOUNT), "subPath": launch.job_id}]
    # The store's own credentials only where the job has none of its own (job_credentials).
    secret = ({"envFrom": [{"secretRef": {"name": config.artifacts_secret}}]}
              if in_store(launch) and config.artifacts_secret and not launch.store_env else {})
    return {
        "name": TRAINER, "image": config.image, "imagePullPolicy": config.image_pull_policy,
        "command": ["sh", "-c", HOLD_SCRIPT, TRAINER, *argv],
        "env": trainer_env(launch, config),
        **secret,
        "resources": trainer_resources(launch, config),
        "volumeMounts": [
            {"name": "inputs", "mountPath": str(INPUTS_MOUNT), "readOnly": True},
            *artifacts,
            {"name": "cache", "mountPath": str(CACHE_MOUNT)},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        # Ready = training: it participates in steps (READY_FILE), and it touches the heartbeat
        # file with every report record. A migration's replacement is promoted once ready.
        "readinessProbe": {"exec": {"command": ["python", "-c", HEARTBEAT_CHECK]},
                           "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 5,
                           "failureThreshold": 3},
        # The last log lines become the termination message: the reason of a bad-input exit.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
    }


def pod_template(launch: Launch, config: ClusterConfig) -> Manifest:
    """What every trainer pod of the job is made from (`trainer_pod`), kept on its anchor."""
    job = launch.job_id
    artifacts = [] if in_store(launch) else [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": config.checkpoints_claim}},
        {"name": "models", "persistentVolumeClaim": {"claimName": config.models_claim}}]
    return {
        "metadata": {"labels": labels(job, TRAINER)},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": TERMINATION_GRACE,
            "securityContext": pod_security(),
            "subdomain": job,
            "containers": [trainer_container(launch, config)],
            "volumes": [
                {"name": "inputs", "persistentVolumeClaim": {
                    "claimName": config.data_claim, "readOnly": True}},
                *artifacts,
                {"name": "cache", "emptyDir": {"sizeLimit": config.cache_size}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            ],
        },
    }
