"""A job's Kubernetes objects, as pure functions of its Launch and the cluster settings.

What the containers run comes from api/backends/programs.py, as on the local backend; only the
addresses differ: a pod's own IP comes from the downward API (`$(POD_IP)`, expanded by the
kubelet) and is the only address its processes listen on, the coordinator is reached through its
Service, and the report token and peer secret come from the job's Secret. Every object carries the
same labels, so one label selector finds a job's pods and one finds every job of this control
plane; the job's NetworkPolicy uses the first to let only the job's own trainers in.

Paths: a trainer pod sees its job's sub-directory of the checkpoints and models PVCs at
/checkpoints and /models (the export goes to /models/model: the trainer writes it next to its
target and renames it into place, which a mount point would refuse), the inputs PVC (read-only)
at /inputs and an emptyDir cache at /cache. The API mounts the two PVCs whole under its volumes
dir and links the job's directories there (see `volume_dirs`), so it reads what the pods wrote.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.backends.base import Launch
from api.backends.programs import (
    LIGHTHOUSE_PORT,
    REPLICA_STORE_PORT,
    STORE_PORT,
    Endpoint,
    coordinator_env,
    lighthouse_argv,
    pod_argv,
    pod_env,
    store_argv,
)
from trainer.contract.runtime import Runtime
from trainer.contract.spec import stages_of
from trainer.contract.store import is_local

Manifest = dict[str, Any]
POD_NAME = Runtime.env_name("pod_name")

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
TRAINER, LIGHTHOUSE, STORE = "trainer", "lighthouse", "store"
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
HOSTNAME_LABEL = "kubernetes.io/hostname"
PLACEMENT_GATE = "live-migrator.io/replaced-first"
"""Holds a restart-mode migration's replacement off the scheduler until the pod it replaces
is gone (two pods of one ordinal cannot share a restart-mode job)."""
READY_FILE = "/tmp/trainer-ready"

REPORT_TOKEN_KEY = "report-token"
PEER_SECRET_KEY = "peer-secret"
SECRET_KEYS = {Runtime.env_name("report_token"): REPORT_TOKEN_KEY,
               Runtime.env_name("peer_secret"): PEER_SECRET_KEY}
"""The trainer's environment variables whose values come from the job's Secret, by key."""
USER_ID = 10001
"""The non-root user of both images (Dockerfile.api, Dockerfile.trainer) and of every pod, the
API's (k8s/base/api.yaml) too: files are created private (PRIVATE_UMASK), so the API reads what
the trainers write on the shared volumes only as their user."""
INPUTS_MOUNT = Path("/inputs")
CHECKPOINTS_MOUNT = Path("/checkpoints")
MODELS_MOUNT = Path("/models")
CACHE_MOUNT = Path("/cache")
HEARTBEAT_FILE = "/tmp/trainer-heartbeat"
HEARTBEAT_MAX_AGE = 60
"""Seconds without a report record after which a trainer pod counts as not ready."""
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
HEARTBEAT_CHECK = ("import os, sys, time; os.stat(os.environ['READY_FILE']); "
                   "sys.exit(time.time() - os.stat(os.environ["
                   "'HEARTBEAT_FILE']).st_mtime > float(os.environ['HEARTBEAT_MAX_AGE']))")


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


def labels(job_id: str, component: str) -> dict[str, str]:
    return {NAME_LABEL: APP, INSTANCE_LABEL: job_id, COMPONENT_LABEL: component,
            PART_OF_LABEL: APP, MANAGED_BY_LABEL: MANAGED_BY, JOB_LABEL: job_id}


def match_labels(job_id: str, component: str) -> dict[str, str]:
    return {JOB_LABEL: job_id, COMPONENT_LABEL: component}


def selector(values: dict[str, str]) -> str:
    """A label selector string for equality on every item."""
    return ",".join(f"{key}={value}" for key, value in values.items())


ALL_TRAINERS = selector({MANAGED_BY_LABEL: MANAGED_BY, COMPONENT_LABEL: TRAINER})
"""Every job's trainer pods (the pod watch) and anchors (re-adoption)."""


def secret_name(job_id: str) -> str:
    return f"{job_id}-report"


def coordinator_name(launch: Launch) -> str:
    return f"{launch.job_id}-{coordinator_component(launch)}"


def coordinator_component(launch: Launch) -> str:
    return LIGHTHOUSE if launch.fault_tolerance == "live" else STORE


def coordinator_endpoint(launch: Launch) -> Endpoint:
    """How pods reach their lighthouse or rendezvous store: its Service's name in the namespace."""
    port = LIGHTHOUSE_PORT if launch.fault_tolerance == "live" else STORE_PORT
    return Endpoint(coordinator_name(launch), port)


def volume_dirs(volumes_dir: Path, job_id: str) -> tuple[Path, Path]:
    """The sub-directories of the checkpoints and models PVCs (mounted whole under
    `volumes_dir` in the API) that a job's pods mount with subPath = job id."""
    return volumes_dir / "checkpoints" / job_id, volumes_dir / "models" / job_id


def exported_model_dir(models_dir: Path) -> Path:
    """Where the export lies inside a job's models directory (MODEL_DIR in the pods)."""
    return models_dir / "model"


def in_store(launch: Launch) -> bool:
    """Whether the job's checkpoints and model go to an object store rather than volumes."""
    return not is_local(launch.checkpoint_dir)


def pod_launch(launch: Launch) -> Launch:
    """The launch as a trainer pod sees it: paths inside the container, not the API's (an
    object store's URLs are the same everywhere)."""
    launch = dataclasses.replace(launch, inputs_dir=INPUTS_MOUNT,
                                 cache_dir=CACHE_MOUNT / "tokens")
    if in_store(launch):
        return launch
    return dataclasses.replace(launch, checkpoint_dir=CHECKPOINTS_MOUNT,
                               model_dir=exported_model_dir(MODELS_MOUNT))


def _metadata(name: str, job_id: str, component: str, namespace: str) -> Manifest:
    return {"name": name, "namespace": namespace, "labels": labels(job_id, component)}


def _container_security() -> Manifest:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _pod_security() -> Manifest:
    return {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID,
            "fsGroup": USER_ID, "seccompProfile": {"type": "RuntimeDefault"}}


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


def pod_ip_env() -> Manifest:
    """The pod's IP from the downward API; listed first, `$(POD_IP)` expands after it."""
    return {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


IDENTITY = (POD_NAME, "POD_ORDINAL", Runtime.env_name("incarnation"))
"""The variables that make a pod of the template one pod (`identity_env`)."""


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
            {"name": Runtime.env_name("heartbeat_file"), "value": HEARTBEAT_FILE},
            {"name": "HEARTBEAT_MAX_AGE", "value": str(HEARTBEAT_MAX_AGE)}]
    return env


def secret_env(launch: Launch, name: str) -> Manifest:
    """The environment variable `name`, filled from the job's Secret by the kubelet (its store
    credential is keyed by its variable's name)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {
        "name": secret_name(launch.job_id), "key": SECRET_KEYS.get(name, name)}}}


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
        "securityContext": _container_security(),
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
            "securityContext": _pod_security(),
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


def anchor(launch: Launch, config: ClusterConfig) -> Manifest:
    """The job's record in the cluster, which owns every other object of it: the pods asked
    for and the pod template (data), the restart tally and the incarnations given out
    (annotations). The control plane makes and replaces the pods from it, as a StatefulSet
    would, but one pod at a time: a migration's replacement runs beside the pod it replaces,
    on the node it was sent to."""
    job = launch.job_id
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {**_metadata(job, job, TRAINER, config.namespace),
                         "annotations": {ISSUED_ANNOTATION: "0"}},
            "data": {REPLICAS_KEY: str(launch.replicas),
                     STAGES_KEY: str(stages_of(launch.spec)), MODE_KEY: launch.fault_tolerance,
                     TEMPLATE_KEY: json.dumps(pod_template(launch, config),
                                              separators=(",", ":"))}}


def pod_name(job_id: str, ordinal: int, incarnation: int) -> str:
    return f"{job_id}-{ordinal}-{incarnation}"


def identity_env(job_id: str, ordinal: int, incarnation: int) -> list[Manifest]:
    return [{"name": POD_NAME, "value": f"{job_id}-{ordinal}"},
            {"name": "POD_ORDINAL", "value": str(ordinal)},
            {"name": Runtime.env_name("incarnation"), "value": str(incarnation)}]


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


def secret(launch: Launch, config: ClusterConfig) -> Manifest:
    """The job's secrets: its report token, the peer secret its pods and coordinator prove to
    each other, and its own store credential if it has one (keyed by variable)."""
    data = {REPORT_TOKEN_KEY: launch.report_token, PEER_SECRET_KEY: launch.peer_secret,
            **launch.store_env}
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": _metadata(secret_name(launch.job_id), launch.job_id, TRAINER,
                                  config.namespace),
            "type": "Opaque", "immutable": True, "stringData": data}


def network_policy(launch: Launch, config: ClusterConfig) -> Manifest:
    """Only the job's own trainers reach its pods: heals, collectives, stores, its coordinator.

    The namespace's policies (k8s/base/network-policy.yaml) let no pod in and leave the rest to
    this one: policies add up, so a namespace-wide allow would let other jobs in too.
    """
    job = launch.job_id
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _metadata(job, job, TRAINER, config.namespace),
            "spec": {"podSelector": {"matchLabels": {JOB_LABEL: job}},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {
                         "matchLabels": match_labels(job, TRAINER)}}]}]}}


def headless_service(launch: Launch, config: ClusterConfig) -> Manifest:
    """The pods' subdomain: stable DNS names `<job>-<ordinal>.<job>` for the pods."""
    job = launch.job_id
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(job, job, TRAINER, config.namespace),
            "spec": {"clusterIP": "None", "selector": match_labels(job, TRAINER),
                     # Peers must find a pod that is starting or healing, before it is ready.
                     "publishNotReadyAddresses": True}}


def coordinator_deployment(launch: Launch, config: ClusterConfig) -> Manifest:
    """The lighthouse (live) or the rendezvous store (restart): one pod, never two at once,
    listening on its pod IP like every process of a job."""
    job, component = launch.job_id, coordinator_component(launch)
    endpoint = coordinator_endpoint(launch)
    # The kubelet expands $(POD_IP), an IPv4 or IPv6 address: each program joins it to its port.
    argv = (lighthouse_argv("$(POD_IP)", endpoint.port) if component == LIGHTHOUSE
            else store_argv(endpoint.port, host="$(POD_IP)"))
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
        "securityContext": _container_security(),
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _metadata(endpoint.host, job, component, config.namespace),
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": match_labels(job, component)},
            "template": {
                "metadata": {"labels": labels(job, component)},
                "spec": {"automountServiceAccountToken": False, "enableServiceLinks": False,
                         "securityContext": _pod_security(), "containers": [container],
                         "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]},
            },
        },
    }


def coordinator_service(launch: Launch, config: ClusterConfig) -> Manifest:
    job, component = launch.job_id, coordinator_component(launch)
    endpoint = coordinator_endpoint(launch)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(endpoint.host, job, component, config.namespace),
            "spec": {"selector": match_labels(job, component),
                     "ports": [{"name": component, "port": endpoint.port,
                                "targetPort": component, "protocol": "TCP"}]}}


def dependents(launch: Launch, config: ClusterConfig) -> list[Manifest]:
    """Everything the anchor owns besides the pods, in creation order (the pods' Secret and
    NetworkPolicy first: the pods wait for the one and cannot reach each other without the
    other)."""
    return [secret(launch, config), network_policy(launch, config),
            headless_service(launch, config), coordinator_deployment(launch, config),
            coordinator_service(launch, config)]


def owner_reference(owner: Manifest) -> Manifest:
    """A reference to a created object (its uid is the server's), for cascading deletion."""
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "blockOwnerDeletion": True}


def owned_by(manifest: Manifest, owner: Manifest) -> Manifest:
    metadata = {**manifest["metadata"], "ownerReferences": [owner_reference(owner)]}
    return {**manifest, "metadata": metadata}


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
