"""The real FastAPI app with MIGRATOR_BACKEND=kubernetes against the fake API server.

The test plays the trainer pods' part: it reads the report token from the job's Secret and
posts reports, and writes the export where the primary pod's mount of the models PVC puts it.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.backends import programs
from api.backends.kubernetes.initializer_job import finished, job_name
from api.backends.kubernetes.labels import INCARNATION_LABEL, JOB_LABEL, REPLICA_LABEL, STAGE_LABEL
from api.backends.kubernetes.secret import REPORT_TOKEN_KEY, secret_name
from api.backends.kubernetes.volumes import exported_model_dir, volume_dirs
from api.settings import Settings
from tests.api.backends.k8s_fake import FakeApiServer
from tests.api.conftest import ADMIN_TOKEN, AUTH, metric
from tests.factories import completed, record
from tests.support import wait_for
from trainer.contract.records import Joined
from trainer.contract.staged import STAGED_FILE, progress_file, staged_dir, staging_id

NS = "live-migrator"
SPEC = {"model": "tiny", "dataset": "reviews.csv", "replicas": 2,
        "resources": {"cpu": "1", "memory": "2Gi"}}


@pytest.fixture
def settings(tmp_path: Path, inputs_dir: Path, kubeconfig: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN, inputs_dir=inputs_dir,
                    backend="kubernetes", k8s_kubeconfig=kubeconfig, reconcile_interval=0.05,
                    k8s_watch_timeout=2, public_url="http://migrator-api.live-migrator.svc:8000")


def start(settings: Settings) -> TestClient:
    """The control plane, to be used in a `with` block (lifespan: reconciler, pod watch)."""
    return TestClient(create_app(settings))


def job_state(client: TestClient, job_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job_id}", headers=AUTH)
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


def wait_job(client: TestClient, job_id: str, check: Callable[[dict[str, Any]], bool],
             what: str) -> dict[str, Any]:
    def matching() -> dict[str, Any] | None:
        state = job_state(client, job_id)
        return state if check(state) else None

    result: dict[str, Any] = wait_for(matching, what=what, timeout=20)
    return result


def pod_events(client: TestClient, job_id: str) -> list[dict[str, Any]]:
    events = client.get(f"/api/v1/jobs/{job_id}/events?type=pod&limit=500", headers=AUTH)
    return [e["data"] for e in events.json()["data"]]


def workload_objects(fake: FakeApiServer, job_id: str) -> list[tuple[str, str, str]]:
    """The job's objects left in the cluster (Kubernetes Events about its pods aside)."""
    with fake.cluster.store.changed:
        return [key for key, obj in fake.cluster.store.objects.items() if key[0] != "events"
                and (obj["metadata"].get("labels") or {}).get(JOB_LABEL) == job_id]


def report_token(fake: FakeApiServer, job_id: str) -> str:
    """What a pod gets as REPORT_TOKEN: the job's Secret (stored base64 by a real server)."""
    secret = fake.cluster.get("secrets", NS, secret_name(job_id))
    data = secret.get("stringData") or {k: base64.b64decode(v).decode()
                                        for k, v in secret["data"].items()}
    return str(data[REPORT_TOKEN_KEY])


def post_report(client: TestClient, fake: FakeApiServer, job_id: str, ordinal: int,
                records: list[dict[str, Any]], incarnation: str = "0",
                token: str | None = None) -> None:
    """`token`: the job's report token read before (its Secret goes with the finished job)."""
    token = token or report_token(fake, job_id)
    response = client.post(f"/api/v1/jobs/{job_id}/reports",
                           headers={"Authorization": f"Bearer {token}"},
                           json={"pod": f"{job_id}-{ordinal}", "incarnation": incarnation,
                                 "records": records})
    assert response.status_code == 200, response.text


def start_training(client: TestClient, fake: FakeApiServer) -> str:
    response = client.post("/api/v1/jobs", json=SPEC, headers=AUTH)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    wait_job(client, job_id, lambda s: [p["phase"] for p in s["pods"]] == ["Running"] * 2,
             "both pods to run")
    for ordinal in (0, 1):
        post_report(client, fake, job_id, ordinal, [metric(1, 1)])
    wait_job(client, job_id, lambda s: s["status"] == "running", "the job to run")
    return job_id


def kill_and_recreate(client: TestClient, fake: FakeApiServer, job_id: str,
                      ordinal: int) -> dict[str, Any]:
    """Kill a pod through the API: the control plane replaces it (a new pod, one restart)."""
    old_uid = fake.cluster.trainer(job_id, ordinal)["metadata"]["uid"]
    killed = client.post(f"/api/v1/jobs/{job_id}/pods/{ordinal}/kill",
                         json={"grace_seconds": 0}, headers=AUTH)
    assert killed.status_code == 202, killed.text
    state = wait_job(client, job_id, lambda s: s["pods"][ordinal]["restarts"] == 1
                     and s["pods"][ordinal]["phase"] == "Running",
                     f"pod {ordinal} to be recreated")
    assert fake.cluster.trainer(job_id, ordinal)["metadata"]["uid"] != old_uid
    return state


def test_job_lifecycle_on_kubernetes(settings: Settings, fake_k8s: FakeApiServer) -> None:
    with start(settings) as client:
        lifecycle(client, settings, fake_k8s)


def lifecycle(client: TestClient, settings: Settings, fake_k8s: FakeApiServer) -> None:
    assert client.get("/readyz").json()["backend"] == "kubernetes"
    job_id = start_training(client, fake_k8s)

    # The objects exist, built from the job: its spec, as stored, for the trainer.
    cluster = fake_k8s.cluster
    assert {(k[0], k[2]) for k in cluster.store.objects if k[0] != "persistentvolumeclaims"} \
        >= {("configmaps", job_id), ("secrets", f"{job_id}-report"), ("services", job_id),
            ("deployments", f"{job_id}-lighthouse"), ("services", f"{job_id}-lighthouse")}
    trainer = cluster.trainer(job_id, 1)["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    stored = job_state(client, job_id)["spec"]
    assert json.loads(env["TRAINER_CONFIG"]) == stored
    assert env["REPORT_URL"] == (f"http://migrator-api.live-migrator.svc:8000/api/v1/jobs/"
                                 f"{job_id}/reports")
    assert env["TORCHFT_LIGHTHOUSE"] == f"http://{job_id}-lighthouse:{programs.LIGHTHOUSE_PORT}"
    assert trainer["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}

    # Kill: the pod is deleted, the control plane replaces it, the event is recorded.
    state = kill_and_recreate(client, fake_k8s, job_id, 1)
    assert state["pods"][0]["restarts"] == 0
    events = pod_events(client, job_id)
    assert any(e.get("action") == "kill" and e["ordinal"] == 1 for e in events)
    assert any(e.get("name") == f"{job_id}-1" and e.get("restarts") == 1 for e in events)

    # An OOM kill restarts the container: a pod event names it.
    cluster.oom_kill(cluster.trainer(job_id, 0)["metadata"]["name"])
    wait_job(client, job_id, lambda s: s["pods"][0]["restarts"] == 1, "the OOM restart")
    oom = [e for e in pod_events(client, job_id) if e.get("reason") == "OOMKilled"]
    assert oom and oom[-1]["exit_code"] == 137 and "OOMKilled" in oom[-1]["message"]

    # Completion: the primary's export lands on the models PVC, both pods report.
    _, models = volume_dirs(settings.resolved_volumes_dir, job_id)
    export = exported_model_dir(models)
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (export / "metrics.json").write_text(json.dumps({"metrics": {"test": {"accuracy": 0.8}}}))
    # Read before the reports: the job may finish, and its Secret go, after the first one.
    token = report_token(fake_k8s, job_id)
    for ordinal in (0, 1):
        export_dir = "/models/model" if ordinal == 0 else None
        post_report(client, fake_k8s, job_id, ordinal,
                    [record(2, completed(export_dir, primary=ordinal == 0))], token=token)
    state = wait_job(client, job_id, lambda s: s["status"] == "succeeded", "the job to succeed")
    model = client.get(f"/api/v1/models/{state['model_id']}", headers=AUTH).json()
    assert model["metrics"] == {"test": {"accuracy": 0.8}}
    delete = [r for r in cluster.requests if r.method == "DELETE"][-1]
    assert (delete.path, delete.query["propagationPolicy"]) == (
        f"/api/v1/namespaces/{NS}/configmaps/{job_id}", "Foreground")
    wait_for(lambda: not workload_objects(fake_k8s, job_id),
             what="the workload to be gone", timeout=10)
    assert (export / "config.json").is_file()  # the model stays on its volume


def test_cancel_deletes_the_workload_and_keeps_checkpoints(
        settings: Settings, fake_k8s: FakeApiServer) -> None:
    with start(settings) as client:
        cancel(client, settings, fake_k8s)


def cancel(client: TestClient, settings: Settings, fake_k8s: FakeApiServer) -> None:
    job_id = start_training(client, fake_k8s)
    checkpoints, _ = volume_dirs(settings.resolved_volumes_dir, job_id)
    (checkpoints / "step-5").mkdir()
    fake_k8s.cluster.collect_garbage = False  # a real foreground deletion takes a while
    response = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=AUTH)
    assert response.status_code == 202, response.text
    assert job_state(client, job_id)["status"] == "cancelled"
    fake_k8s.cluster.collect_garbage = True
    wait_for(lambda: not workload_objects(fake_k8s, job_id),
             what="the workload to be gone", timeout=10)
    assert (settings.jobs_dir / job_id / "checkpoints" / "step-5").is_dir()
    killed = client.post(f"/api/v1/jobs/{job_id}/pods/0/kill", headers=AUTH)
    assert killed.status_code == 409


def test_restarted_api_re_adopts_and_a_410_is_survived(
        settings: Settings, fake_k8s: FakeApiServer) -> None:
    with start(settings) as first:
        job_id = start_training(first, fake_k8s)
    # The control plane stopped (its pod watch too); the workload ran on. A new one adopts it.
    with start(settings) as second:
        assert job_state(second, job_id)["status"] == "running"
        backend = second.app.state.backend  # type: ignore[attr-defined]
        # Its first list must come before the compaction: a list taken after it is up to date,
        # and no watch from there is too old (on a loaded machine, the list can come late).
        wait_for(backend.watcher.synced.is_set, what="the new pod watch's first list",
                 timeout=30)
        with fake_k8s.cluster.store.changed:
            fake_k8s.cluster.store.compact()
        wait_for(lambda: backend.watcher.relists >= 1,
                 what="the watch to list again after 410", timeout=10)
        killed = second.post(f"/api/v1/jobs/{job_id}/pods/0/kill", headers=AUTH)
        assert killed.status_code == 202
        # Running again once the recreated pod takes part in a step (degraded until then).
        wait_job(second, job_id, lambda s: s["pods"][0]["restarts"] == 1
                 and s["pods"][0]["phase"] == "Running" and s["status"] == "running",
                 "pod 0 to be recreated and the job to run in full again")
        assert any(e.get("name") == f"{job_id}-0" and e.get("restarts") == 1
                   for e in pod_events(second, job_id))


def test_bad_input_fails_the_job_and_deletes_the_workload(
        settings: Settings, fake_k8s: FakeApiServer) -> None:
    with start(settings) as client:
        job_id = start_training(client, fake_k8s)
        pod = fake_k8s.cluster.trainer(job_id, 1)["metadata"]["name"]
        fake_k8s.cluster.crash_loop(pod, 2, message=(
            f"2026-11-23 10:00:01,456 ERROR job={job_id} pod={job_id}-1 trainer: model "
            "'tiny': no config.json\n"))
        state = wait_job(client, job_id, lambda s: s["status"] == "failed", "the job to fail")
        assert state["reason"] == f"pod {job_id}-1 failed: bad input: model 'tiny': no config.json"
        # The kubelet reports the exit, then the back-off: the job may fail on the first.
        crash = [e for e in pod_events(client, job_id)
                 if e.get("reason") in ("Error", "CrashLoopBackOff")]
        assert crash and crash[-1]["phase"] == "Failed"
        wait_for(lambda: not workload_objects(fake_k8s, job_id),
                 what="the workload to be gone", timeout=10)


def test_a_pod_migrates_to_the_node_named_through_the_api(
        settings: Settings, fake_k8s: FakeApiServer) -> None:
    cluster = fake_k8s.cluster
    cluster.ready_on_start = False  # ready once told: a trainer that took part in a step
    with start(settings) as client:
        job_id = start_training(client, fake_k8s)
        old = cluster.trainer(job_id, 0)
        there = next(node for node in cluster.nodes if node != old["spec"]["nodeName"])
        path = f"/api/v1/jobs/{job_id}/pods/0/migrate"
        same = client.post(path, json={"node": old["spec"]["nodeName"]}, headers=AUTH)
        assert same.status_code == 422 and "node" in str(same.json()["detail"])
        moved = client.post(path, json={"node": there}, headers=AUTH)
        assert moved.status_code == 202, moved.text
        again = client.post(path, json={}, headers=AUTH)
        assert again.status_code == 409 and "already migrating" in again.json()["detail"]

        replacement = cluster.trainer(job_id, 0)
        incarnation = replacement["metadata"]["labels"][INCARNATION_LABEL]
        assert replacement["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": [there]}]}]
        wait_for(lambda: cluster.pod(replacement["metadata"]["name"])["status"].get("podIP"),
                 what="the replacement to run", timeout=10)
        # It takes part in a step: ready, and its first report says so.
        cluster.set_ready(replacement["metadata"]["name"])
        post_report(client, fake_k8s, job_id, 0, [record(1, Joined(
            message="joined", pod=f"{job_id}-0", step=2, epoch=1, participants=3),
            time=time.time())], incarnation=incarnation)
        migrated = wait_for(lambda: [e["data"] for e in client.get(
            f"/api/v1/jobs/{job_id}/events?type=job&limit=500", headers=AUTH).json()["data"]
            if e["data"].get("type") == "migrated"], what="the migrated event", timeout=10)
        assert (migrated[0]["old_incarnation"], migrated[0]["new_incarnation"],
                migrated[0]["node_to"]) == ("0", incarnation, there)
        wait_for(lambda: cluster.store.find("pods", NS, old["metadata"]["name"]) is None,
                 what="the old pod to leave", timeout=10)
        assert cluster.trainer(job_id, 0)["spec"]["nodeName"] == there
        state = wait_job(client, job_id, lambda s: s["pods"][0]["phase"] == "Running",
                         "pod 0 to run")
        assert state["pods"][0]["restarts"] == 0  # it left gracefully
        assert not [e for e in pod_events(client, job_id) if e.get("phase") == "Failed"]


def test_a_pipeline_job_runs_replicas_times_stages_labelled_pods(
        settings: Settings, fake_k8s: FakeApiServer) -> None:
    spec = {**SPEC, "parallelism": "pipeline", "fault_tolerance": "restart",
            "pipeline_stages": 2, "batch_size": 8}
    cluster = fake_k8s.cluster
    with start(settings) as client:
        response = client.post("/api/v1/jobs", json=spec, headers=AUTH)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        state = wait_job(client, job_id, lambda s: [p["phase"] for p in s["pods"]]
                         == ["Running"] * 4, "the four pods to run")
        assert [(p["replica"], p["stage"]) for p in state["pods"]] == [
            (0, 0), (0, 1), (1, 0), (1, 1)]
        for ordinal in range(4):
            pod_labels = cluster.trainer(job_id, ordinal)["metadata"]["labels"]
            assert (pod_labels[REPLICA_LABEL], pod_labels[STAGE_LABEL]) == (
                str(ordinal // 2), str(ordinal % 2))
            command = cluster.trainer(job_id, ordinal)["spec"]["containers"][0]["command"]
            assert "--nnodes=4:4" in command  # every round waits for every stage
        assert ("deployments", f"{job_id}-store") in {(k[0], k[2]) for k in cluster.store.objects}

        # A killed stage pod comes back as the same replica and stage.
        kill_and_recreate(client, fake_k8s, job_id, 3)
        replacement = cluster.trainer(job_id, 3)["metadata"]
        assert (replacement["labels"][REPLICA_LABEL],
                replacement["labels"][STAGE_LABEL]) == ("1", "1")
        scaled = client.patch(f"/api/v1/jobs/{job_id}", json={"replicas": 3}, headers=AUTH)
        assert scaled.status_code == 422 and "replicas" in scaled.text



def play_initializers(fake: FakeApiServer, inputs: Path, model_dir: Path) -> None:
    """Do what each running initializer Job would: stage what it names (a model's files for a
    model), `staged.json` last, as its rename makes it appear whole; then end it succeeded."""
    with fake.cluster.store.changed:
        running = [job for (plural, _, _), job in fake.cluster.store.objects.items()
                   if plural == "jobs" and not finished(job)]
    for job in running:
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        kind, repo_id, revision = command[3], command[4], command[command.index("--revision") + 1]
        target = staged_dir(inputs, kind, repo_id, revision)
        if kind == "model":
            shutil.copytree(model_dir, target)
        target.mkdir(parents=True, exist_ok=True)
        files = sorted(f.name for f in target.iterdir())
        size = sum(f.stat().st_size for f in target.iterdir())
        (target / STAGED_FILE).write_text(json.dumps(
            {"kind": kind, "repo_id": repo_id, "revision": revision, "commit": "abc123",
             "files": files, "bytes": size}))
        fake.cluster.succeed_job(job["metadata"]["name"])


def test_a_hub_model_is_staged_by_an_initializer_job_before_the_pods_start(
        settings: Settings, fake_k8s: FakeApiServer, tiny_model_dir: Path) -> None:
    hub = "acme/tiny-bert"
    staging, inputs = staging_id("model", hub), settings.resolved_inputs_dir
    cluster = fake_k8s.cluster
    with start(settings) as client:
        response = client.post("/api/v1/jobs", json={**SPEC, "model": hub}, headers=AUTH)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        assert response.json()["status"] == "preparing"
        job = cluster.job(job_name(staging))
        assert job["spec"]["template"]["spec"]["containers"][0]["command"][3:5] == [
            "model", hub]
        # The API reads the initializer's progress through its own mount of the volume.
        progress = progress_file(inputs, staging)
        progress.parent.mkdir(parents=True)
        progress.write_text(json.dumps(
            {"state": "running", "bytes_done": 1000, "bytes_total": 4000, "files": 3}))
        shown = wait_for(lambda: (rows := client.get("/api/v1/stagings", headers=AUTH).json()[
            "data"]) and rows[0]["bytes_done"] == 1000 and rows[0], what="the progress",
            timeout=10)
        assert (shown["status"], shown["bytes_total"]) == ("running", 4000)
        assert job_state(client, job_id)["status"] == "preparing"
        assert not [key for key in cluster.store.objects if key[0] == "pods"]

        wait_for(lambda: play_initializers(fake_k8s, inputs, tiny_model_dir) or [
            p["phase"] for p in job_state(client, job_id)["pods"]] == ["Running"] * 2,
            what="both pods to run", timeout=20)
        for ordinal in (0, 1):
            env = {e["name"]: e.get("value") for e in
                   cluster.trainer(job_id, ordinal)["spec"]["containers"][0]["env"]}
            assert (env["HF_HUB_OFFLINE"], env["HF_DATASETS_OFFLINE"]) == ("1", "1")
        rows = {r["id"]: r for r in client.get("/api/v1/stagings", headers=AUTH).json()["data"]}
        assert rows[staging]["status"] == "succeeded" and rows[staging]["bytes_done"] > 0
        messages = [e["data"].get("message", "") for e in client.get(
            f"/api/v1/jobs/{job_id}/events?type=job", headers=AUTH).json()["data"]]
        assert any(m.startswith(f"staged model {hub}@main") for m in messages)
