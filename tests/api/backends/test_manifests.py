"""A job's Kubernetes objects: valid against the official schemas, built from programs.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from api.backends import programs
from api.backends.base import Launch, Resources
from api.backends.kubernetes import pods
from api.backends.kubernetes.anchor import (
    ISSUED_ANNOTATION,
    REPLICAS_KEY,
    STAGES_KEY,
    TEMPLATE_KEY,
    anchor,
    dependents,
)
from api.backends.kubernetes.cluster import ClusterConfig
from api.backends.kubernetes.coordinator import (
    coordinator_deployment,
    coordinator_endpoint,
    coordinator_service,
)
from api.backends.kubernetes.labels import (
    INCARNATION_LABEL,
    ORDINAL_LABEL,
    REPLICA_LABEL,
    STAGE_LABEL,
    labels,
    owned_by,
)
from api.backends.kubernetes.network import headless_service, network_policy
from api.backends.kubernetes.pods import kill_event
from api.backends.kubernetes.secret import secret, secret_name
from api.backends.kubernetes.template import (
    HEARTBEAT_CHECK,
    HOLD_SCRIPT,
    READY_FILE,
    cpu_count,
    trainer_container,
    trainer_resources,
)
from api.backends.kubernetes.volumes import exported_model_dir, pod_launch, volume_dirs
from tests.api.backends.k8s_fake import SCHEMA_VERSION
from tests.conftest import Processes
from tests.support import accepts, free_port, has_ipv6_loopback, wait_for
from trainer.contract.artifact_store import location
from trainer.contract.spec import JobSpec

CLUSTER = ClusterConfig(namespace="live-migrator", image="registry.example/trainer:1.2.3")


def make_launch(mode: str = "live", replicas: int = 3, resources: Resources | None = None,
                ) -> Launch:
    return Launch(job_id="job-1a2b3c4d", pods=replicas, fault_tolerance=mode,  # type: ignore[arg-type]
                  spec=JobSpec(replicas=replicas, model="tiny", fault_tolerance=mode),
                  report_url="http://migrator-api.live-migrator.svc:8000/api/v1/jobs/"
                             "job-1a2b3c4d/reports",
                  report_token="the-report-token", peer_secret="the-peer-secret",
                  checkpoint_dir=Path("/data/jobs/x/checkpoints"),
                  model_dir=Path("/data/jobs/x/model"), inputs_dir=Path("/data/inputs"),
                  cache_dir=Path("/data/cache"), resources=resources)


def created(launch: Launch) -> dict[str, Any]:
    """The job's anchor as the API server returns it (with a uid)."""
    owner = anchor(launch, CLUSTER)
    owner["metadata"] = {**owner["metadata"], "uid": "0b7e0c1e-1111-2222-3333-444455556666"}
    return owner


def trainer_pod(launch: Launch, ordinal: int = 1, incarnation: int = 4,
                **placement: Any) -> dict[str, Any]:
    owner = created(launch)
    template = json.loads(owner["data"][TEMPLATE_KEY])
    return pods.trainer_pod(template, owner, ordinal, incarnation, **placement)


def objects(launch: Launch) -> list[dict[str, Any]]:
    return [anchor(launch, CLUSTER), *dependents(launch, CLUSTER)]


def container(launch: Launch) -> dict[str, Any]:
    spec = trainer_pod(launch)["spec"]
    assert [c["name"] for c in spec["containers"]] == ["trainer"]
    return spec["containers"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["live", "restart"])
def test_every_object_validates_strictly(mode: str) -> None:
    launch = make_launch(mode, resources=Resources(cpu="500m", memory="3Gi", gpus=1))
    owner = created(launch)
    kinds = []
    for obj in objects(launch):
        for candidate in (obj, owned_by(obj, owner)):
            assert kubernetes_validate.validate(candidate, SCHEMA_VERSION, strict=True)
        kinds.append((obj["kind"], obj["metadata"]["name"]))
    coordinator = "lighthouse" if mode == "live" else "store"
    assert kinds == [("ConfigMap", "job-1a2b3c4d"), ("Secret", "job-1a2b3c4d-report"),
                     ("NetworkPolicy", "job-1a2b3c4d"), ("Service", "job-1a2b3c4d"),
                     ("Deployment", f"job-1a2b3c4d-{coordinator}"),
                     ("Service", f"job-1a2b3c4d-{coordinator}")]
    for placement in ({}, {"node": "node-b"}, {"avoid": "node-a", "replaces": 3},
                      {"node": "node-c", "gated": True}):
        pod = trainer_pod(launch, **placement)
        assert kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
    event = kill_event("job-1a2b3c4d", {"metadata": {"name": "job-1a2b3c4d-0", "uid": "u-1"}},
                       0, "live-migrator", "2026-11-23T10:00:00Z")
    assert kubernetes_validate.validate(event, SCHEMA_VERSION, strict=True)


def test_strict_validation_refuses_a_misspelt_field() -> None:
    """The schema check the tests rely on does catch mistakes in a pod."""
    pod = trainer_pod(make_launch())
    pod["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)


def test_anchor_and_pod_shape_labels_and_security() -> None:
    launch = make_launch(replicas=3)
    owner = created(launch)
    assert owner["data"][REPLICAS_KEY] == "3"
    assert owner["metadata"]["annotations"] == {ISSUED_ANNOTATION: "0"}
    trainer = trainer_pod(launch, ordinal=1, incarnation=4)
    pod = trainer["spec"]
    assert trainer["metadata"]["name"] == "job-1a2b3c4d-1-4"
    assert (pod["hostname"], pod["subdomain"], pod["restartPolicy"]) == (
        "job-1a2b3c4d-1", "job-1a2b3c4d", "Always")
    assert trainer["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "job-1a2b3c4d",
        "uid": owner["metadata"]["uid"], "blockOwnerDeletion": True, "controller": True}]
    common = {
        "app.kubernetes.io/name": "live-migrator", "app.kubernetes.io/instance": "job-1a2b3c4d",
        "app.kubernetes.io/component": "trainer", "app.kubernetes.io/part-of": "live-migrator",
        "app.kubernetes.io/managed-by": "live-migrator-api",
        "live-migrator.io/job": "job-1a2b3c4d"}
    assert owner["metadata"]["labels"] == common
    assert trainer["metadata"]["labels"] == {**common, ORDINAL_LABEL: "1",
                                             INCARNATION_LABEL: "4",
                                             REPLICA_LABEL: "1",
                                             STAGE_LABEL: "0"}
    env = container(launch)["env"]
    assert env[0]["name"] == "POD_IP"  # first: later values expand $(POD_IP)
    assert {e["name"]: e.get("value") for e in env[1:4]} == {
        "POD_NAME": "job-1a2b3c4d-1", "POD_ORDINAL": "1", "POD_INCARNATION": "4"}
    assert "affinity" not in pod and "schedulingGates" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container(launch)["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"}}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["inputs"]["persistentVolumeClaim"] == {"claimName": "migrator-data",
                                                          "readOnly": True}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "migrator-checkpoints"
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "migrator-models"
    assert volumes["cache"] == {"name": "cache", "emptyDir": {"sizeLimit": "8Gi"}}
    mounts = {m["name"]: m for m in container(launch)["volumeMounts"]}
    assert mounts["inputs"]["readOnly"] is True
    assert (mounts["checkpoints"]["subPath"], mounts["models"]["subPath"]) == (
        "job-1a2b3c4d", "job-1a2b3c4d")
    # Every writable path is a volume: the root filesystem is read-only.
    assert {m["mountPath"] for m in mounts.values()} == {
        "/inputs", "/checkpoints", "/models", "/cache", "/tmp", "/dev/shm"}


def test_a_pipeline_jobs_pods_carry_their_replica_and_stage() -> None:
    launch = dataclasses.replace(make_launch("restart", replicas=6), spec=JobSpec(
        replicas=2, model="tiny", fault_tolerance="restart", parallelism="pipeline",
        pipeline_stages=3))
    owner = created(launch)
    assert owner["data"][REPLICAS_KEY] == "6"
    assert owner["data"][STAGES_KEY] == "3"
    places = []
    for ordinal in range(6):
        pod = trainer_pod(launch, ordinal=ordinal)
        assert kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
        pod_labels = pod["metadata"]["labels"]
        places.append((pod_labels[REPLICA_LABEL], pod_labels[STAGE_LABEL]))
    assert places == [("0", "0"), ("0", "1"), ("0", "2"), ("1", "0"), ("1", "1"), ("1", "2")]
    # Every round of a pipeline's rendezvous needs every stage of every replica.
    assert "--nnodes=6:6" in container(launch)["command"]
    assert "REPLICA_STORE" not in str(container(launch)["env"])

    # Live: each replica's stages meet at its stage 0, through the headless Service's DNS.
    live = dataclasses.replace(launch, fault_tolerance="live",
                               spec=launch.spec.model_copy(update={"fault_tolerance": "live"}))
    stores = []
    for ordinal in range(6):
        pod = trainer_pod(live, ordinal=ordinal)
        assert kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        stores.append(env["REPLICA_STORE"])
    first, second = (f"job-1a2b3c4d-{o}.job-1a2b3c4d:{programs.REPLICA_STORE_PORT}"
                     for o in (0, 3))
    assert stores == [first] * 3 + [second] * 3


def test_paths_the_pods_write_are_the_paths_the_api_reads(tmp_path: Path) -> None:
    launch = make_launch()
    env = {e["name"]: e.get("value") for e in container(launch)["env"]}
    mounts = {m["name"]: m for m in container(launch)["volumeMounts"]}
    checkpoints, models = volume_dirs(tmp_path, launch.job_id)
    # CHECKPOINT_DIR is the checkpoints mount (PVC sub-directory <job>), MODEL_DIR lies in the
    # models mount (PVC sub-directory <job>): the API links those same sub-directories.
    assert env["CHECKPOINT_DIR"] == mounts["checkpoints"]["mountPath"]
    assert checkpoints == tmp_path / "checkpoints" / mounts["checkpoints"]["subPath"]
    model_in_pod = Path(env["MODEL_DIR"])
    assert model_in_pod.parent == Path(mounts["models"]["mountPath"])
    assert exported_model_dir(models) == (
        tmp_path / "models" / mounts["models"]["subPath"] / model_in_pod.name)


def test_artifacts_in_a_store_need_no_volumes_and_come_with_the_stores_secret() -> None:
    root = "az://artifacts/live-migrator/job-1a2b3c4d"
    launch = dataclasses.replace(make_launch(), checkpoint_dir=location(f"{root}/checkpoints"),
                                 model_dir=location(f"{root}/model"))
    cluster = dataclasses.replace(CLUSTER, artifacts_secret="migrator-artifacts")
    owner = anchor(launch, cluster)
    owner["metadata"] = {**owner["metadata"], "uid": "0b7e0c1e-1111-2222-3333-444455556666"}
    template = json.loads(owner["data"][TEMPLATE_KEY])
    pod = pods.trainer_pod(template, owner, 1, 4)
    assert kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
    trainer = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert (env["CHECKPOINT_DIR"], env["MODEL_DIR"]) == (f"{root}/checkpoints", f"{root}/model")
    assert trainer["envFrom"] == [{"secretRef": {"name": "migrator-artifacts"}}]
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert {"inputs", "cache"} <= volumes and not {"checkpoints", "models"} & volumes
    assert not {"checkpoints", "models"} & {m["name"] for m in trainer["volumeMounts"]}
    # On volumes, as before: no secret is handed over.
    assert "envFrom" not in container(make_launch())


def test_a_job_with_its_own_store_credential_gets_it_from_its_secret_alone() -> None:
    root = "az://artifacts-job-1a2b3c4d"
    sas = "BlobEndpoint=https://account.blob.core.windows.net/;SharedAccessSignature=sv=x&si=pods"
    launch = dataclasses.replace(make_launch(), checkpoint_dir=location(f"{root}/checkpoints"),
                                 model_dir=location(f"{root}/model"),
                                 store_env={"AZURE_STORAGE_CONNECTION_STRING": sas})
    cluster = dataclasses.replace(CLUSTER, artifacts_secret="migrator-artifacts")
    job_secret = secret(launch, cluster)
    assert job_secret["stringData"]["AZURE_STORAGE_CONNECTION_STRING"] == sas
    trainer = trainer_container(launch, cluster)
    assert "envFrom" not in trainer  # not the store's own credentials
    assert {"name": "AZURE_STORAGE_CONNECTION_STRING", "valueFrom": {"secretKeyRef": {
        "name": secret_name(launch.job_id), "key": "AZURE_STORAGE_CONNECTION_STRING",
    }}} in trainer["env"]
    assert sas not in json.dumps(anchor(launch, cluster))


@pytest.mark.parametrize("mode", ["live", "restart"])
def test_trainer_runs_the_shared_pod_command_and_environment(mode: str) -> None:
    launch = make_launch(mode)
    pod_view = pod_launch(launch)
    coordinator = programs.Endpoint(f"job-1a2b3c4d-{'lighthouse' if mode == 'live' else 'store'}",
                                    programs.LIGHTHOUSE_PORT if mode == "live"
                                    else programs.STORE_PORT)
    trainer = container(launch)
    assert trainer["image"] == "registry.example/trainer:1.2.3"
    assert trainer["command"] == ["sh", "-c", HOLD_SCRIPT, "trainer",
                                  *programs.pod_argv(pod_view, coordinator, "$(POD_IP)")]
    expected = programs.pod_env(pod_view, "job-1a2b3c4d-1", coordinator, "$(POD_IP)",
                                threads=2, incarnation="4",
                                ready_file=Path(READY_FILE))
    env = trainer["env"]
    names = [e["name"] for e in env]
    assert names[:4] == ["POD_IP", "POD_NAME", "POD_ORDINAL", "POD_INCARNATION"]
    literal = {e["name"]: e["value"] for e in env if "value" in e}
    secrets = {"REPORT_TOKEN": "report-token", "PEER_SECRET": "peer-secret"}
    assert {k: v for k, v in expected.items() if k not in secrets} == {
        k: literal[k] for k in expected if k not in secrets}
    # The job's secrets come from its Secret, never as literals.
    assert [e for e in env if e["name"] in secrets] == [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": "job-1a2b3c4d-report",
                                                      "key": key}}}
        for name, key in secrets.items()]
    assert "the-report-token" not in str(trainer) and "the-peer-secret" not in str(trainer)
    assert literal["POD_ADDRESS"] == "$(POD_IP)"  # where every process of the pod listens
    assert (literal["HEARTBEAT_FILE"], literal["HF_HOME"]) == ("/tmp/trainer-heartbeat",
                                                               "/cache/huggingface")
    if mode == "live":
        assert literal["TORCHFT_LIGHTHOUSE"] == f"http://{coordinator}"
    else:
        assert f"--rdzv-endpoint={coordinator}" in trainer["command"]
        assert "--local-addr=$(POD_IP)" in trainer["command"]


def test_coordinators_run_the_shared_commands_behind_a_service() -> None:
    live, restart = make_launch("live"), make_launch("restart")
    lighthouse = coordinator_deployment(live, CLUSTER)
    store = coordinator_deployment(restart, CLUSTER)
    # Each listens on its pod IP only, which the kubelet expands from the downward API: an IPv4
    # or an IPv6 address, so it is an argument of its own, joined to the port by the program.
    assert lighthouse["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "-m", "trainer.fault_tolerance.lighthouse", "--min_replicas", "1",
        "--replicas", str(live.spec.replicas), "--host", "$(POD_IP)", "--port", "29510",
        "--quorum_tick_ms", "100",
        "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "500"]
    assert store["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "-m", "trainer.fault_tolerance.kv_store", "--host", "$(POD_IP)",
        "--port", "29400", "--state-file", "/tmp/store.json"]
    # Its keys on the pod's emptyDir at /tmp: a restarted container serves the rendezvous again.
    spec = store["spec"]["template"]["spec"]
    assert {"name": "tmp", "mountPath": "/tmp"} in spec["containers"][0]["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}} in spec["volumes"]
    for launch, deployment in ((live, lighthouse), (restart, store)):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["env"][0] == {"name": "POD_IP", "valueFrom": {
            "fieldRef": {"fieldPath": "status.podIP"}}}
        # The job's peer secret, to tell its members from strangers: from the job's Secret.
        assert {"name": "PEER_SECRET", "valueFrom": {"secretKeyRef": {
            "name": "job-1a2b3c4d-report", "key": "peer-secret"}}} in container["env"]
        assert "the-peer-secret" not in str(deployment)
        service = coordinator_service(launch, CLUSTER)
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two at once
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        port = coordinator_endpoint(launch).port
        assert service["spec"]["ports"][0]["port"] == port
        assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback (::1) here")
@pytest.mark.parametrize("mode", ["live", "restart"])
def test_a_coordinator_listens_on_an_ipv6_pod_ip(mode: str, processes: Processes,
                                                 tmp_path: Path) -> None:
    """The coordinator's command as the kubelet runs it in a pod of an IPv6-only cluster: its
    $(POD_IP) expanded to an IPv6 address (here ::1), and a member of the job reaches it there."""
    from trainer.contract import credentials
    from trainer.fault_tolerance import lighthouse
    from trainer.fault_tolerance.kv_store import MemberStore

    launch = make_launch(mode)
    command = coordinator_deployment(launch, CLUSTER)["spec"]["template"]["spec"][
        "containers"][0]["command"]
    fixed, port = str(coordinator_endpoint(launch).port), free_port("::1")
    argv = [sys.executable if arg == "python" else
            arg.replace("$(POD_IP)", "::1").replace(fixed, str(port))
            .replace("/tmp/", f"{tmp_path}/") for arg in command]  # /tmp: the pod's emptyDir
    process = processes.start(argv, programs.coordinator_env(launch),
                              tmp_path / "coordinator.log")
    wait_for(lambda: accepts(port, "::1"), process=process, timeout=30,
             what=f"the {mode} coordinator to listen on [::1]:{port}")
    endpoint = programs.Endpoint("::1", port)
    assert str(endpoint) == f"[::1]:{port}"  # as pods are told of it
    assert programs.Endpoint.parse(str(endpoint)) == endpoint  # as an adopting supervisor reads it
    secret = launch.peer_secret
    if mode == "live":
        lighthouse.leave(f"http://{endpoint}", credentials.member_id(secret, "job-1a2b3c4d-0"))
    else:
        client = MemberStore(str(endpoint), credentials.store_credential(secret),
                             timedelta(seconds=30))
        client.set("reached", "over IPv6")
        assert client.get("reached") == b"over IPv6"
        # Kept where the pod's emptyDir is mounted, for a restarted container to read back.
        assert "reached" in json.loads((tmp_path / "store.json").read_text())
    assert process.poll() is None, (tmp_path / "coordinator.log").read_text()


def test_secret_and_headless_service() -> None:
    launch = make_launch()
    job_secret = secret(launch, CLUSTER)
    assert job_secret["stringData"] == {"report-token": "the-report-token",
                                        "peer-secret": "the-peer-secret"}
    assert job_secret["immutable"] is True
    # Restart pods never heal, but meet in the job's store as members.
    restart = secret(make_launch("restart"), CLUSTER)
    assert restart["stringData"] == {"report-token": "the-report-token",
                                     "peer-secret": "the-peer-secret"}
    service = headless_service(launch, CLUSTER)
    assert service["spec"] == {"clusterIP": "None", "publishNotReadyAddresses": True,
                               "selector": {"live-migrator.io/job": "job-1a2b3c4d",
                                            "app.kubernetes.io/component": "trainer"}}


@pytest.mark.parametrize("mode", ["live", "restart"])
def test_only_the_jobs_own_trainers_reach_its_pods(mode: str) -> None:
    policy = network_policy(make_launch(mode), CLUSTER)
    assert policy == {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "job-1a2b3c4d", "namespace": "live-migrator",
                     "labels": labels("job-1a2b3c4d", "trainer")},
        "spec": {
            # Its trainers and its coordinator: heals, collectives, stores, quorums.
            "podSelector": {"matchLabels": {"live-migrator.io/job": "job-1a2b3c4d"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {
                "live-migrator.io/job": "job-1a2b3c4d",
                "app.kubernetes.io/component": "trainer"}}}]}]}}
    selected = policy["spec"]["podSelector"]["matchLabels"].items()
    reached = [trainer_pod(make_launch(mode)),
               coordinator_deployment(make_launch(mode), CLUSTER)["spec"]["template"]]
    assert all(selected <= pod["metadata"]["labels"].items() for pod in reached)


def test_resources_come_from_the_spec_or_the_defaults() -> None:
    assert trainer_resources(make_launch(), CLUSTER) == {
        "requests": {"cpu": "2", "memory": "6Gi"}, "limits": {"cpu": "2", "memory": "6Gi"}}
    gpu = make_launch(resources=Resources(cpu="500m", gpus=2))
    assert trainer_resources(gpu, CLUSTER) == {
        "requests": {"cpu": "500m", "memory": "6Gi"},
        "limits": {"cpu": "500m", "memory": "6Gi", "nvidia.com/gpu": "2"}}
    assert {e["name"]: e.get("value") for e in container(gpu)["env"]}["OMP_NUM_THREADS"] == "1"
    assert [cpu_count(q) for q in ("500m", "2", "2.5", "1500m")] == [1, 2, 3, 2]


def test_owned_objects_point_at_the_created_anchor() -> None:
    owner = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "job-1a2b3c4d", "uid": "uid-1"}}
    owned = owned_by(secret(make_launch(), CLUSTER), owner)
    assert owned["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "job-1a2b3c4d", "uid": "uid-1",
        "blockOwnerDeletion": True}]


# --- the two small programs inside the trainer container, run for real -------------------


@pytest.fixture
def hold(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Runs the trainer container's first process around a stand-in trainer."""
    started: list[subprocess.Popen[bytes]] = []

    def run(child: str) -> subprocess.Popen[bytes]:
        with (tmp_path / "stderr").open("wb") as stderr:
            started.append(subprocess.Popen(
                ["sh", "-c", HOLD_SCRIPT, "trainer", sys.executable, "-c", child],
                cwd=tmp_path, stderr=stderr, start_new_session=True))
        return started[-1]

    yield run
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_hold_passes_a_failure_on(hold: Callable[[str], subprocess.Popen[bytes]]) -> None:
    process = hold("import sys; sys.exit(2)")
    assert process.wait(timeout=30) == 2


def test_hold_keeps_the_pod_after_success_until_sigterm(
        tmp_path: Path, hold: Callable[[str], subprocess.Popen[bytes]]) -> None:
    process = hold("open('done', 'w').close()")
    wait_for(lambda: (tmp_path / "done").exists(),
             what="the stand-in trainer to finish", timeout=30)
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.5)  # held: the kubelet would otherwise restart the trainer
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert b"holding the pod" in (tmp_path / "stderr").read_bytes()
    # Nothing of it is left behind (in a container, its end would end everything anyway).
    wait_for(lambda: not group_alive(process.pid), what="the held sleep to end", timeout=10)


def test_hold_forwards_sigterm_to_the_trainer(
        tmp_path: Path, hold: Callable[[str], subprocess.Popen[bytes]]) -> None:
    child = ("import signal, sys, time, pathlib\n"
             "def stop(*_):\n    pathlib.Path('checkpointed').touch(); sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, stop)\npathlib.Path('ready').touch()\n"
             "time.sleep(60)\nsys.exit(1)\n")
    process = hold(child)
    wait_for(lambda: (tmp_path / "ready").exists(),
             what="the stand-in trainer to start", timeout=30)
    process.send_signal(signal.SIGTERM)
    # The trainer checkpoints and exits 0; a stopped pod ends then, without holding.
    assert process.wait(timeout=10) == 0
    assert (tmp_path / "checkpointed").exists()


def test_readiness_probe_reads_the_ready_file_and_the_heartbeat_age(tmp_path: Path) -> None:
    heartbeat, ready = tmp_path / "heartbeat", tmp_path / "ready"
    env = {**os.environ, "HEARTBEAT_FILE": str(heartbeat), "HEARTBEAT_MAX_AGE": "60",
           "READY_FILE": str(ready)}
    probe = [sys.executable, "-c", HEARTBEAT_CHECK]
    assert subprocess.run(probe, env=env, capture_output=True).returncode != 0  # no file yet
    heartbeat.touch()  # reporting, but healing: not ready until it took part in a step
    assert subprocess.run(probe, env=env, capture_output=True).returncode != 0
    ready.touch()
    assert subprocess.run(probe, env=env).returncode == 0
    stale = time.time() - 120
    os.utime(heartbeat, (stale, stale))
    assert subprocess.run(probe, env=env).returncode == 1
