"""The whole product on one machine: `python -m api`, the local backend, real trainer pods."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import psutil
import pytest

from api import migrations
from tests.api.conftest import ADMIN_TOKEN
from tests.api.control_plane import ControlPlane
from tests.conftest import Processes
from tests.factories import (
    make_poisoned_csv,
    make_poisoned_model,
    make_reviews_csv,
    poisoned_steps,
    tiny_spec,
)
from tests.postgres import PostgresServer
from tests.stores import Store
from tests.support import not_private, wait_for
from trainer.checkpoint import latest_checkpoint, list_checkpoints
from trainer.contract.artifact_store import location
from trainer.contract.checkpoints import NAME
from trainer.contract.spec import JobSpec

pytestmark = pytest.mark.slow

SPEC = tiny_spec(replicas=2, epochs=3, checkpoint_every_steps=4, fault_tolerance="restart")


def test_job_runs_to_a_downloadable_model(control_plane: ControlPlane, tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    created = control_plane.http.post("/api/v1/jobs", json=SPEC)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = control_plane.wait_status(job_id, "succeeded", "failed")
    assert job["status"] == "succeeded", job["reason"]
    assert job["progress"]["epoch"] == 3 and job["metrics"]["test_accuracy"] >= 0.9
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
               for pid in control_plane.pod_pids(job_id))
    models = control_plane.http.get("/api/v1/models").json()["data"]
    assert [m["job_id"] for m in models] == [job_id] and models[0]["id"] == job["model_id"]
    archive = control_plane.http.get(f"/api/v1/models/{job['model_id']}/download")
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content), mode="r:gz") as tar:
        tar.extractall(tmp_path / "download", filter="data")
    loaded = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "download" / job["model_id"])
    assert loaded.config.id2label == {0: "negative", 1: "positive"}
    predictions = control_plane.http.post(
        f"/api/v1/models/{job['model_id']}/predict",
        json={"texts": ["a brilliant warm film", "a dull and tedious plot"]}).json()
    assert [p["label"] for p in predictions["predictions"]] == ["positive", "negative"]
    checkpoints = control_plane.http.get(f"/api/v1/jobs/{job_id}/checkpoints").json()
    assert checkpoints and checkpoints[0]["epoch_end"]
    # What the control plane, the supervisor and the pods wrote is this user's alone: the
    # database (its WAL too), the job's directory (launch.json, logs, checkpoints, the model)
    # and the tokenization cache.
    written = {path.relative_to(control_plane.data_dir).as_posix()
               for path in control_plane.data_dir.rglob("*")}
    assert {"migrator.db-wal", f"jobs/{job_id}/launch.json", f"jobs/{job_id}/model/config.json",
            f"jobs/{job_id}/logs", "cache/tokens"} <= written
    assert not_private(control_plane.data_dir) == []


def test_a_nan_loss_fails_the_job_with_the_step_and_the_value(control_plane: ControlPlane,
                                                              inputs_dir: Path) -> None:
    """Restart mode, two pods under torchrun: both see the NaN (their gradients are averaged)
    and exit as for bad input, which no restart retries."""
    make_poisoned_model(inputs_dir / "poisoned")
    make_poisoned_csv(inputs_dir / "poisoned.csv")
    spec = {**SPEC, "model": "poisoned", "dataset": "poisoned.csv", "epochs": 1}
    step = poisoned_steps(JobSpec(**spec), inputs_dir, epochs=1, participants=2)[0]
    job_id = control_plane.http.post("/api/v1/jobs", json=spec).json()["id"]
    job = control_plane.wait_status(job_id, "succeeded", "failed")
    assert job["status"] == "failed"
    assert job["reason"].endswith(f"failed: bad input: loss became nan at step {step}; the "
                                  "spec's nonfinite_loss \"skip\" would skip such steps")
    failed = [e["data"] for e in control_plane.events(job_id, "job")
              if e["data"].get("type") == "failed"]
    assert failed and {e["reason"] for e in failed} == {"non_finite_loss"}
    assert [p["restarts"] for p in job["pods"]] == [0, 0]


def test_killed_pod_is_recreated_and_the_job_succeeds(control_plane: ControlPlane) -> None:
    job_id = control_plane.http.post("/api/v1/jobs", json=SPEC).json()["id"]
    wait_for(lambda: control_plane.job(job_id)["progress"]["step"] >= 5,
             what="training", timeout=180)
    killed = control_plane.http.post(f"/api/v1/jobs/{job_id}/pods/1/kill",
                                     json={"grace_seconds": 0})
    assert killed.status_code == 202
    job = control_plane.wait_status(job_id, "succeeded", "failed")
    assert job["status"] == "succeeded", job["reason"]
    assert job["pods"][1]["restarts"] == 1
    pod_events = control_plane.events(job_id, "pod")
    assert any(e["data"].get("action") == "kill" and e["data"]["ordinal"] == 1
               for e in pod_events)
    assert any(e["data"].get("restarts") == 1 for e in pod_events)


def test_a_jobs_fork_server_comes_from_the_template_with_no_secret(
        control_plane: ControlPlane) -> None:
    """The control plane's template (api/backends/local/template.py) forks the job's fork
    server, whose forks the pods and the job's rendezvous store are: none of them imports torch
    again, and no pod holds the control plane's secrets in its environment block, nor its own
    job's."""
    job_id = control_plane.http.post("/api/v1/jobs", json={**SPEC, "epochs": 30}).json()["id"]
    wait_for(lambda: control_plane.job(job_id)["progress"]["step"] >= 2, what="training",
             timeout=180)
    servers = {psutil.Process(pid).ppid() for pid in control_plane.pod_pids(job_id)}
    assert len(servers) == 1
    server = servers.pop()
    # Forked, not executed afresh (the server does that where a child's environment differs
    # in what libraries read as they load): each shows the command line of its server.
    store = psutil.Process(control_plane.state(job_id)["coordinator"]["pid"])
    assert store.ppid() == server
    for pid in [store.pid, *control_plane.pod_pids(job_id)]:
        assert psutil.Process(pid).cmdline() == psutil.Process(server).cmdline()
    assert control_plane.processes.forks is not None
    template = control_plane.processes.forks.template_process()
    assert psutil.Process(server).ppid() == template.pid
    secrets = [ADMIN_TOKEN, json.loads((control_plane.data_dir / "jobs" / job_id
                                        / "launch.json").read_text())["peer_secret"]]
    for pid in control_plane.pod_pids(job_id):
        block = json.dumps(psutil.Process(pid).environ())
        assert "MIGRATOR_" not in block and not [s for s in secrets if s in block]
    assert control_plane.http.post(f"/api/v1/jobs/{job_id}/finish").status_code == 202
    assert control_plane.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"


def test_api_killed_mid_job_loses_no_report(control_plane: ControlPlane) -> None:
    job_id = control_plane.http.post("/api/v1/jobs", json=SPEC).json()["id"]
    wait_for(lambda: control_plane.job(job_id)["progress"]["step"] >= 2,
             what="training", timeout=180)
    control_plane.kill()
    # The pods keep training and buffer their reports while the API is down.
    checkpoints = control_plane.data_dir / "jobs" / job_id / "checkpoints"
    wait_for(lambda: (latest := latest_checkpoint(checkpoints)) and latest.step >= 8,
             what="a checkpoint written while the API is down", timeout=180)
    control_plane.start()
    job = control_plane.wait_status(job_id, "succeeded", "failed")
    assert job["status"] == "succeeded", job["reason"]
    for ordinal in (0, 1):
        steps = [e["data"]["step"] for e in control_plane.events(job_id, "metric")
                 if e["data"]["pod"] == f"{job_id}-{ordinal}" and e["data"]["kind"] == "metric"]
        assert steps == list(range(1, job["progress"]["step"] + 1)), ordinal


def test_a_job_with_a_killed_pod_on_postgresql(tmp_path: Path, inputs_dir: Path,
                                               processes: Processes,
                                               postgres: PostgresServer) -> None:
    """The control plane on a real PostgreSQL database: a job with a SIGKILLed pod runs to a
    registered model, and its rows are in PostgreSQL (no SQLite file appears)."""
    import psycopg

    url = postgres.create_database()
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    plane = ControlPlane(processes, tmp_path / "data", inputs_dir,
                         env={"MIGRATOR_DATABASE_URL": url})
    plane.start()
    try:
        job_id = plane.http.post("/api/v1/jobs", json=SPEC).json()["id"]
        wait_for(lambda: plane.job(job_id)["progress"]["step"] >= 5, what="training",
                 timeout=180)
        assert plane.http.post(f"/api/v1/jobs/{job_id}/pods/1/kill",
                               json={"grace_seconds": 0}).status_code == 202
        job = plane.wait_status(job_id, "succeeded", "failed")
        assert job["status"] == "succeeded", job["reason"]
        assert job["pods"][1]["restarts"] == 1 and job["model_id"]
        assert [m["id"] for m in plane.http.get("/api/v1/models").json()["data"]] == [
            job["model_id"]]
    finally:
        plane.close()
    assert not (tmp_path / "data" / "migrator.db").exists()
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(host="127.0.0.1", port=postgres.port, user="postgres",
                         dbname=database) as connection:
        metrics = connection.execute("SELECT count(*) FROM event WHERE job_id = %s AND "
                                     "type = 'metric'", (job_id,)).fetchone()
        revision = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    assert metrics is not None and metrics[0] >= 5
    assert revision is not None and revision[0] == migrations.head()


def test_a_job_with_a_killed_pod_keeps_its_artifacts_in_an_object_store(
        tmp_path: Path, inputs_dir: Path, processes: Processes, object_store: Store) -> None:
    """MIGRATOR_ARTIFACTS_URL on each object store (Azure Blob: a real Azurite and adlfs; S3:
    moto's real server and obstore): a restart job whose pod is SIGKILLed resumes from
    checkpoints in the store, exports its model there, and the API lists, streams and predicts
    from the store; no artifact is written locally and the store's credentials appear in no
    event or log."""
    from transformers import AutoModelForSequenceClassification

    root = object_store.new_location("artifacts") + "/live-migrator"
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    plane = ControlPlane(processes, tmp_path / "data", inputs_dir,
                         env={"MIGRATOR_ARTIFACTS_URL": root, **object_store.env})
    plane.start()
    try:
        job_id = plane.http.post("/api/v1/jobs", json=SPEC).json()["id"]
        checkpoints = location(f"{root}/{job_id}/checkpoints")
        wait_for(lambda: latest_checkpoint(checkpoints) is not None, timeout=180,
                 what="a checkpoint in the store")
        assert plane.http.post(f"/api/v1/jobs/{job_id}/pods/1/kill",
                               json={"grace_seconds": 0}).status_code == 202
        job = plane.wait_status(job_id, "succeeded", "failed")
        assert job["status"] == "succeeded", job["reason"]
        assert job["pods"][1]["restarts"] == 1
        resumed = [e for e in plane.events(job_id, "job") if e["data"].get("type") == "resumed"]
        assert resumed and all(e["data"]["step"] >= 4 for e in resumed), resumed

        listed = plane.http.get(f"/api/v1/jobs/{job_id}/checkpoints").json()
        assert [c["id"] for c in listed] == [
            i.path.name for i in reversed(list_checkpoints(checkpoints))]
        assert listed[0]["size_bytes"] > 0
        assert not [p for p in checkpoints.iterdir() if not NAME.match(p.name)]  # no leftovers
        archive = plane.http.get(f"/api/v1/jobs/{job_id}/checkpoints/{listed[0]['id']}/download")
        with tarfile.open(fileobj=io.BytesIO(archive.content), mode="r:gz") as tar:
            assert f"{listed[0]['id']}/COMPLETE" in tar.getnames()

        model_id = job["model_id"]
        archive = plane.http.get(f"/api/v1/models/{model_id}/download")
        assert archive.status_code == 200
        with tarfile.open(fileobj=io.BytesIO(archive.content), mode="r:gz") as tar:
            tar.extractall(tmp_path / "download", filter="data")
        loaded = AutoModelForSequenceClassification.from_pretrained(
            tmp_path / "download" / model_id)
        assert loaded.config.id2label == {0: "negative", 1: "positive"}
        predicted = plane.http.post(f"/api/v1/models/{model_id}/predict",
                                    json={"texts": ["a brilliant warm film"]})
        assert predicted.status_code == 200, predicted.text
        assert (tmp_path / "data" / "cache" / "models" / model_id / "config.json").is_file()

        local = tmp_path / "data" / "jobs" / job_id
        assert not (local / "checkpoints").exists() and not (local / "model").exists()
        key = object_store.secret
        events = plane.http.get(f"/api/v1/jobs/{job_id}/events", params={"limit": 1000}).text
        logs = "".join(p.read_text(errors="replace") for p in local.rglob("*.log"))
        assert key not in events and key not in logs and key not in json.dumps(job)

        assert plane.http.delete(f"/api/v1/models/{model_id}").status_code == 204
        assert not location(f"{root}/{job_id}/model").exists()
        assert not (tmp_path / "data" / "cache" / "models" / model_id).exists()
    finally:
        plane.close()


def test_a_jobs_pods_hold_a_credential_for_their_own_container_alone(
        tmp_path: Path, inputs_dir: Path, processes: Processes, azure_server: Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MIGRATOR_ARTIFACTS_PER_JOB on a real Azurite: the job's pods, one of them SIGKILLed,
    train, resume and export with a SAS for the job's own container and never see the
    account's key; the API serves what they wrote, and revokes the SAS once the job ended."""
    from azure.storage.blob import BlobServiceClient

    for name, value in azure_server.env.items():  # the test reads the store as the API does
        monkeypatch.setenv(name, value)
    root = azure_server.new_location("jobs")
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    plane = ControlPlane(processes, tmp_path / "data", inputs_dir,
                         env={"MIGRATOR_ARTIFACTS_URL": root, "MIGRATOR_ARTIFACTS_PER_JOB": "1",
                              **azure_server.env})
    plane.start()
    try:
        job_id = plane.http.post("/api/v1/jobs", json=SPEC).json()["id"]
        checkpoints = location(f"{root}-{job_id}/checkpoints")
        wait_for(lambda: latest_checkpoint(checkpoints) is not None, timeout=180,
                 what="a checkpoint in the job's container")
        # The pods get the launch's store environment: a SAS, never the key. (Forks, they show
        # in /proc the environment their template started with: nothing of any job's.)
        launch = json.loads((plane.data_dir / "jobs" / job_id / "launch.json").read_text())
        assert "SharedAccessSignature=" in launch["store_env"]["AZURE_STORAGE_CONNECTION_STRING"]
        environments = [process.environ() for pid in plane.pod_pids(job_id)
                        for process in [psutil.Process(pid), *psutil.Process(pid).children()]]
        assert environments and azure_server.secret not in json.dumps([launch, environments])
        assert plane.http.post(f"/api/v1/jobs/{job_id}/pods/1/kill",
                               json={"grace_seconds": 0}).status_code == 202
        job = plane.wait_status(job_id, "succeeded", "failed")
        assert job["status"] == "succeeded", job["reason"]
        resumed = [e for e in plane.events(job_id, "job") if e["data"].get("type") == "resumed"]
        assert resumed, "the killed pod's group resumed from the container"
        assert plane.http.get(f"/api/v1/models/{job['model_id']}/download").status_code == 200

        container = f"{root}-{job_id}".removeprefix("az://")
        connection = azure_server.env["AZURE_STORAGE_CONNECTION_STRING"]

        def revoked() -> bool:
            with BlobServiceClient.from_connection_string(connection) as client:
                policy = client.get_container_client(container).get_container_access_policy()
            return not policy["signed_identifiers"]

        wait_for(revoked, what="the job's SAS to be revoked", timeout=30)
    finally:
        plane.close()
