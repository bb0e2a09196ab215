"""A staging's initializer Job: the one pod that reaches the Hugging Face hub, staging one
repository (or a job's tokenized splits, or a dataset file imported by URL) onto the data
volume (trainer.initializer) for every job and pod that names it, or pushing a succeeded job's
model to the hub (the models volume mounted read-only).

It runs the trainer image as trainer pods do (non-root, read-only root filesystem, no
capabilities, no service-account token), but mounts the data volume read-write at /inputs
(trainer pods mount it read-only) and has its hub client online. Its progress file lies under
/inputs, where the API reads it through its own mount of the same volume. What it may reach is
the namespace's policy for initializers (k8s/base/network-policy.yaml): HTTPS and DNS out,
nothing in. It gets the artifacts store's credentials where trainer pods do
(MIGRATOR_K8S_ARTIFACTS_SECRET): an import from the store, a push of a model kept there. The
Job is no job's: one delete of a job's anchor leaves it, and a later job that
names the same repository finds it staged or still staging.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from api.backends.base import StagingRequest
from api.backends.kubernetes.cluster import (
    ClusterConfig,
    Manifest,
    container_security,
    pod_security,
)
from api.backends.kubernetes.labels import INITIALIZER, staging_labels
from api.backends.kubernetes.volumes import INPUTS_MOUNT, MODELS_MOUNT
from trainer.contract.staged import ONLINE_ENV

REPOSITORY_ANNOTATION = "live-migrator.io/repository"
"""On the Job: what it stages (`model org/name@main`), for `kubectl describe`."""
HUB_TOKEN_KEY = "HF_TOKEN"
"""The key of the hub token in the Secret `MIGRATOR_K8S_HUB_TOKEN_SECRET` names."""
BACKOFF_LIMIT = 2
"""Pods of one Job that may fail before it does: a download broken off by the network."""
DEADLINE_SECONDS = 6 * 3600
"""How long one Job may take, its retries included (a large model over a slow link)."""
KEPT_SECONDS = 3600
"""How long a finished Job (and its pod's log) stays before Kubernetes deletes it."""
REQUESTS = {"cpu": "500m", "memory": "1Gi"}
"""What a download needs; a tokenization takes more, up to a trainer pod's memory limit."""
FINISHED = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
"""A Job's conditions that say it has ended or is ending (the last two come first, while its
pods terminate)."""


def job_name(staging_id: str) -> str:
    """`stage-<hash>`: the staging's id (`st-<hash>`) as a Job name, one Job per staging."""
    return "stage-" + staging_id.removeprefix("st-")


def initializer_env(config: ClusterConfig) -> list[Manifest]:
    """The hub client online, its files under /tmp; the API's hub endpoint, and the token from
    its Secret (never a literal), where configured."""
    env: list[Manifest] = [{"name": "HOME", "value": "/tmp"},
                           {"name": "HF_HOME", "value": "/tmp/hf"},
                           *({"name": name, "value": value} for name, value in ONLINE_ENV.items())]
    if config.hub_endpoint:
        env.append({"name": "HF_ENDPOINT", "value": config.hub_endpoint})
    if config.hub_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": config.hub_token_secret, "key": HUB_TOKEN_KEY}}})
    return env


def pod_request(request: StagingRequest, volumes_dir: Path) -> StagingRequest:
    """The request as its pod sees it: a push's model (on the models volume, which the API
    mounts under `volumes_dir`) under the pod's read-only mount of that volume."""
    if request.kind != "push" or request.spec is None:
        return request
    options = json.loads(request.spec)
    model, models = Path(options["model_dir"]), volumes_dir / "models"
    if model.is_relative_to(models):  # else an object store's URL: the same everywhere
        options["model_dir"] = str(MODELS_MOUNT / model.relative_to(models))
    return dataclasses.replace(request, spec=json.dumps(options))


def initializer_container(request: StagingRequest, config: ClusterConfig) -> Manifest:
    # The artifacts store's credentials: an import from it, a push of a model kept in it.
    store = ({"envFrom": [{"secretRef": {"name": config.artifacts_secret}}]}
             if config.artifacts_secret else {})
    models = ([{"name": "models", "mountPath": str(MODELS_MOUNT), "readOnly": True}]
              if request.kind == "push" else [])
    return {
        "name": INITIALIZER, "image": config.image, "imagePullPolicy": config.image_pull_policy,
        # Its progress file is the default one under --inputs (trainer.contract.staged).
        "command": ["python", "-m", "trainer.initializer", request.kind, request.repo_id,
                    "--revision", request.revision, "--inputs", str(INPUTS_MOUNT),
                    *(["--spec", request.spec] if request.spec else [])],
        "env": initializer_env(config), **store,
        "resources": {"requests": REQUESTS, "limits": {"memory": config.memory}},
        "volumeMounts": [{"name": "inputs", "mountPath": str(INPUTS_MOUNT)},
                         {"name": "tmp", "mountPath": "/tmp"}, *models],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
    }


def initializer_job(request: StagingRequest, config: ClusterConfig) -> Manifest:
    """The Job that stages `request`, named and labelled after its staging."""
    labels = staging_labels(request.staging_id)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name(request.staging_id), "namespace": config.namespace,
                     "labels": labels, "annotations": {REPOSITORY_ANNOTATION: (
                         f"{request.kind} {request.repo_id}@{request.revision}")}},
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": KEPT_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "restartPolicy": "Never",
                    "securityContext": pod_security(),
                    "containers": [initializer_container(request, config)],
                    "volumes": [
                        {"name": "inputs", "persistentVolumeClaim": {
                            "claimName": config.data_claim}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
                        *([{"name": "models", "persistentVolumeClaim": {
                            "claimName": config.models_claim, "readOnly": True}}]
                          if request.kind == "push" else []),
                    ],
                },
            },
        },
    }


def finished(job: dict[str, Any]) -> bool:
    """Whether the Job has ended (or is ending): succeeded, failed, or past its deadline."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in FINISHED and c.get("status") == "True" for c in conditions)
