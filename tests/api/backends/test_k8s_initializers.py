"""Staging on Kubernetes: one initializer Job per staging (api/backends/kubernetes/initializers.py
and initializer_job.py) against the fake API server, and the namespace's policy for its pods."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from api.backends.base import StagingRequest
from api.backends.kubernetes.backend import KubernetesBackend, cluster_config
from api.backends.kubernetes.cluster import USER_ID, ClusterConfig
from api.backends.kubernetes.initializer_job import initializer_job, job_name, pod_request
from api.backends.kubernetes.labels import LIGHTHOUSE, STORE, TRAINER, labels, staging_labels
from api.backends.kubernetes.template import pod_template
from api.settings import Settings
from tests.api.backends.k8s_fake import FakeApiServer, Request
from tests.api.backends.test_kubernetes import make_launch
from tests.k8s.test_kustomize import base, egress_out_allowed, ingress_allowed, selects
from trainer.contract.staged import staging_id

NS = "live-migrator"
REPO = "acme/tiny-bert"
STAGING = staging_id("model", REPO, "v1.0")
JOB = job_name(STAGING)


@pytest.fixture
def settings(tmp_path: Path, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    return Settings(data_dir=tmp_path / "data", backend="kubernetes", k8s_kubeconfig=kubeconfig,
                    k8s_trainer_image="registry.example/trainer:1.2.3",
                    k8s_image_pull_policy="Always", k8s_watch_timeout=2)


@pytest.fixture
def backend(settings: Settings) -> Iterator[KubernetesBackend]:
    made = KubernetesBackend.from_settings(settings)
    yield made
    made.close()


def request_for(settings: Settings) -> StagingRequest:
    return StagingRequest(STAGING, "model", REPO, "v1.0", settings.resolved_inputs_dir,
                          settings.data_dir / "stagings" / f"{STAGING}.log")


def job_requests(fake: FakeApiServer) -> list[Request]:
    return [r for r in fake.cluster.requests if "/jobs" in r.path]


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_job_runs_the_initializer_as_trainer_pods_run_but_writes_the_data_volume(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    backend.stage(request_for(settings))
    (create,) = job_requests(fake_k8s)
    assert (create.method, create.path) == ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs")
    assert create.body == initializer_job(request_for(settings), cluster_config(settings))
    job = fake_k8s.cluster.job(JOB)
    assert job["metadata"]["name"] == "stage-" + STAGING.removeprefix("st-")
    assert job["metadata"]["labels"] == job["spec"]["template"]["metadata"]["labels"] == (
        staging_labels(STAGING))
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"],
            spec["ttlSecondsAfterFinished"]) == (2, 6 * 3600, 3600)
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (
        "registry.example/trainer:1.2.3", "Always")
    assert container["command"] == ["python", "-m", "trainer.initializer", "model", REPO,
                                    "--revision", "v1.0", "--inputs", "/inputs"]
    # As a trainer pod: non-root, read-only root, no capabilities, no token, the same image.
    trainer = pod_template(make_launch(settings), cluster_config(settings))["spec"]
    assert container["securityContext"] == trainer["containers"][0]["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"] == trainer["securityContext"]
    assert pod["securityContext"]["runAsUser"] == USER_ID and pod["securityContext"][
        "runAsNonRoot"]
    assert (pod["automountServiceAccountToken"], pod["enableServiceLinks"],
            pod["restartPolicy"]) == (False, False, "Never")
    # Unlike one: the data volume read-write, its hub client online, nothing else mounted.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"/inputs", "/tmp"} and not mounts["/inputs"].get("readOnly")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["inputs"]["persistentVolumeClaim"] == {"claimName": "migrator-data"}
    assert "emptyDir" in volumes["tmp"]
    assert env_of(job) == {"HOME": "/tmp", "HF_HOME": "/tmp/hf", "HF_HUB_OFFLINE": "0",
                           "HF_DATASETS_OFFLINE": "0"}
    assert trainer["volumes"][0]["persistentVolumeClaim"]["readOnly"] is True  # as before


def test_a_tokens_staging_gets_the_job_spec_and_room_to_tokenize() -> None:
    key = "0123456789abcdef"
    spec = '{"model": "acme/tiny-bert", "dataset": "imdb"}'
    request = StagingRequest(staging_id("tokens", key), "tokens", key, "main", Path("/data"),
                             Path("/data/x.log"), spec=spec)
    job = initializer_job(request, ClusterConfig(namespace=NS, image="trainer:1", memory="5Gi"))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][3:] == ["tokens", key, "--revision", "main", "--inputs",
                                        "/inputs", "--spec", spec]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"},
                                      "limits": {"memory": "5Gi"}}  # a trainer pod's


def test_the_apis_hub_endpoint_and_token_secret_reach_the_job(
        settings: Settings, kubeconfig: Path, fake_k8s: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "https://hub-mirror.example")
    monkeypatch.setenv("MIGRATOR_K8S_HUB_TOKEN_SECRET", "migrator-hub")
    configured = Settings(data_dir=settings.data_dir, backend="kubernetes",
                          k8s_kubeconfig=kubeconfig, k8s_watch_timeout=2)
    backend = KubernetesBackend.from_settings(configured)
    try:
        backend.stage(request_for(configured))
    finally:
        backend.close()
    env = env_of(fake_k8s.cluster.job(JOB))
    assert env["HF_ENDPOINT"] == "https://hub-mirror.example"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "migrator-hub", "key": "HF_TOKEN"}}
    # Trainer pods get neither: the hub is the initializer's alone.
    trainer_env = {e["name"] for e in pod_template(make_launch(configured), cluster_config(
        configured))["spec"]["containers"][0]["env"]}
    assert not trainer_env & {"HF_ENDPOINT", "HF_TOKEN"}
    monkeypatch.setenv("MIGRATOR_K8S_HUB_ENDPOINT", "https://other.example")  # over the API's
    assert cluster_config(Settings()).hub_endpoint == "https://other.example"


def test_a_push_job_reads_the_model_from_the_models_volume_with_the_stores_credentials(
        settings: Settings, kubeconfig: Path, fake_k8s: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIGRATOR_K8S_ARTIFACTS_SECRET", "migrator-artifacts")
    configured = Settings(data_dir=settings.data_dir, backend="kubernetes",
                          k8s_kubeconfig=kubeconfig, k8s_watch_timeout=2)
    model = configured.resolved_volumes_dir / "models" / "job-1" / "model"
    staging = staging_id("push", "acme/reviews", "job-1")
    backend = KubernetesBackend.from_settings(configured)
    try:  # created through the fake API server, which checks it against the schemas
        backend.stage(StagingRequest(staging, "push", "acme/reviews", "job-1",
                                     configured.resolved_inputs_dir, Path("/x.log"),
                                     spec=json.dumps({"model_dir": str(model),
                                                      "private": True})))
    finally:
        backend.close()
    job = fake_k8s.cluster.job(job_name(staging))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The API's path to the model becomes the pod's, under its read-only mount of the volume.
    spec = json.loads(container["command"][container["command"].index("--spec") + 1])
    assert spec == {"model_dir": "/models/job-1/model", "private": True}
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container[
        "volumeMounts"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "migrator-models",
                                                         "readOnly": True}} in pod["volumes"]
    assert container["envFrom"] == [{"secretRef": {"name": "migrator-artifacts"}}]
    # A model kept in the object store is named by its URL, the same for the pod.
    request = StagingRequest(staging, "push", "acme/reviews", "job-1", Path("/data"),
                             Path("/x.log"), spec='{"model_dir": "s3://bucket/job-1/model"}')
    assert pod_request(request, configured.resolved_volumes_dir) == request


def test_staging_is_true_while_the_job_runs_and_false_once_it_ended(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    assert backend.staging(STAGING) is False  # no Job
    backend.stage(request_for(settings))
    assert fake_k8s.cluster.job(JOB)["status"]["active"] == 1
    since = len(fake_k8s.cluster.requests)
    assert backend.staging(STAGING) is True
    assert fake_k8s.cluster.served(since) == {("get", "jobs"): 1}  # one GET a call
    fake_k8s.cluster.succeed_job(JOB)
    assert backend.staging(STAGING) is False

    fake_k8s.cluster.delete("jobs", NS, JOB, None, "Background")
    backend.stage(request_for(settings))
    assert backend.staging(STAGING) is True
    fake_k8s.cluster.fail_job(JOB)
    assert backend.staging(STAGING) is False


def test_an_unreadable_job_is_taken_as_running(
        backend: KubernetesBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(*args: Any, **kwargs: Any) -> None:
        raise ApiException(status=503, reason="Service Unavailable")

    monkeypatch.setattr(backend.initializers.batch, "read_namespaced_job", unavailable)
    assert backend.staging(STAGING) is True  # the next pass asks again


def test_a_second_stage_while_one_runs_creates_nothing(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    backend.stage(request_for(settings))
    uid = fake_k8s.cluster.job(JOB)["metadata"]["uid"]
    since = len(fake_k8s.cluster.requests)
    backend.stage(request_for(settings))
    # Create (409: one is there), then a read that finds it running; no delete.
    assert fake_k8s.cluster.served(since) == {("create", "jobs"): 1, ("get", "jobs"): 1}
    assert fake_k8s.cluster.job(JOB)["metadata"]["uid"] == uid
    assert backend.staging(STAGING) is True


def test_a_stage_after_a_failure_replaces_the_job(
        backend: KubernetesBackend, settings: Settings, fake_k8s: FakeApiServer) -> None:
    backend.stage(request_for(settings))
    old = fake_k8s.cluster.job(JOB)["metadata"]["uid"]
    fake_k8s.cluster.fail_job(JOB)
    since = len(fake_k8s.cluster.requests)
    backend.stage(request_for(settings))
    delete = next(r for r in fake_k8s.cluster.requests[since:] if r.method == "DELETE")
    assert (delete.path, delete.query["propagationPolicy"]) == (
        f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}", "Background")
    assert fake_k8s.cluster.served(since) == {("create", "jobs"): 2, ("get", "jobs"): 1,
                                              ("delete", "jobs"): 1}
    new = fake_k8s.cluster.job(JOB)
    assert new["metadata"]["uid"] != old and new["status"]["active"] == 1
    assert backend.staging(STAGING) is True


def test_only_initializer_pods_reach_out_and_only_on_https_and_dns() -> None:
    objects = base()
    policies = [d for d in objects.values() if d["kind"] == "NetworkPolicy"]
    own = objects[("NetworkPolicy", "migrator-initializers")]["spec"]
    initializer = staging_labels(STAGING)
    api = objects[("Deployment", "migrator-api")]["spec"]["template"]["metadata"]["labels"]
    others = [labels("job-1", component) for component in (TRAINER, LIGHTHOUSE, STORE)]
    # It selects initializer pods alone, and no other policy selects them.
    assert selects(own["podSelector"], initializer)
    assert not any(selects(own["podSelector"], pod) for pod in [*others, api])
    assert [p["metadata"]["name"] for p in policies
            if selects(p["spec"]["podSelector"], initializer)] == ["migrator-initializers"]
    # Out: DNS to the cluster's DNS pods, HTTPS anywhere; nothing else, and nothing in.
    assert own["policyTypes"] == ["Ingress", "Egress"] and own.get("ingress") is None
    dns, https = own["egress"]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {
                              "kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert https == {"ports": [{"port": 443, "protocol": "TCP"}]}
    assert egress_out_allowed(policies, initializer, 443)
    assert not egress_out_allowed(policies, initializer, 80)
    for source in [*others, api, {"app": "anything-else"}]:
        assert not ingress_allowed(policies, source, initializer, 8000)
    # Trainers and their coordinators keep no way out: they load what was staged.
    for pod in others:
        assert not egress_out_allowed(policies, pod, 443)
