import io
import shutil
import tarfile
import urllib.parse
import urllib.request

import torch
from fastapi.testclient import TestClient

from tests.api.conftest import AUTH, create_job
from tests.api.fakes import FakeBackend
from tests.stores import Store
from trainer.checkpoint import load_checkpoint, save_checkpoint


def test_list_and_download(client: TestClient, backend: FakeBackend, tmp_path) -> None:
    job = create_job(client)
    directory = backend.launches[0].checkpoint_dir
    for step, accuracy in ((5, None), (10, 0.7)):
        save_checkpoint(directory, step, {"w": torch.ones(3) * step}, {"step": step},
                        {"epoch": 1, "epoch_end": step == 10,
                         "metrics": {"val_accuracy": accuracy}})
    (directory / "step-15.tmp").mkdir()  # a write in progress is not listed
    base = f"/api/v1/jobs/{job['id']}/checkpoints"
    listed = client.get(base, headers=AUTH).json()
    assert [(c["id"], c["step"], c["epoch_end"], c["val_accuracy"]) for c in listed] == [
        ("step-10", 10, True, 0.7), ("step-5", 5, False, None)]
    assert all(c["size_bytes"] > 0 for c in listed)

    response = client.get(listed[0]["links"]["download"], headers=AUTH)
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        archive.extractall(tmp_path, filter="data")
    model_state, _, meta = load_checkpoint(tmp_path / "step-10")
    assert torch.equal(model_state["w"], torch.ones(3) * 10) and meta["step"] == 10

    link = client.post(f"{base}/step-10/download-link", headers=AUTH).json()
    assert client.get(link["url"]).status_code == 200
    assert client.get(listed[0]["links"]["download"]).status_code == 401
    assert client.post(f"{base}/step-99/download-link", headers=AUTH).status_code == 404


def test_of_a_steps_revisions_only_the_newest_is_listed_and_served(
        client: TestClient, backend: FakeBackend, tmp_path) -> None:
    job = create_job(client)
    directory = backend.launches[0].checkpoint_dir
    meta = {"epoch": 1, "emergency": True, "epoch_end": False, "metrics": {"val_accuracy": None}}
    save_checkpoint(directory, 7, {"w": torch.zeros(3)}, {}, meta, shared=True)
    shutil.copytree(directory / "step-7", tmp_path / "emergency")
    save_checkpoint(directory, 7, {"w": torch.zeros(3)}, {},
                    {**meta, "epoch_end": True, "metrics": {"val_accuracy": 0.9}})
    shutil.copytree(tmp_path / "emergency", directory / "step-7")  # its deletion cut short
    base = f"/api/v1/jobs/{job['id']}/checkpoints"
    listed = client.get(base, headers=AUTH).json()
    assert [(c["id"], c["step"], c["epoch_end"], c["val_accuracy"]) for c in listed] == [
        ("step-7.r1", 7, True, 0.9)]
    assert client.get(listed[0]["links"]["download"], headers=AUTH).status_code == 200
    assert client.get(f"{base}/step-7/download", headers=AUTH).status_code == 404


def test_unknown_or_malicious_ids_are_404(client: TestClient) -> None:
    job = create_job(client)
    base = f"/api/v1/jobs/{job['id']}/checkpoints"
    assert client.get(base, headers=AUTH).json() == []
    for bad in ("step-99", "..%2F..%2Fadmin_token", "step-1.tmp", "%2Fetc%2Fpasswd"):
        assert client.get(f"{base}/{bad}/download", headers=AUTH).status_code == 404, bad
    assert client.get("/api/v1/jobs/job-nope/checkpoints", headers=AUTH).status_code == 404


def save_steps(directory, accuracies: dict[int, float | None]) -> None:
    for step, accuracy in accuracies.items():
        save_checkpoint(directory, step, {"w": torch.ones(3) * step}, {"step": step},
                        {"epoch": 1, "epoch_end": False, "metrics": {"val_accuracy": accuracy}},
                        keep=100)


def listed(client: TestClient, job_id: str) -> list[str]:
    return [c["id"] for c in client.get(f"/api/v1/jobs/{job_id}/checkpoints",
                                        headers=AUTH).json()]


def test_deleting_checkpoints_spares_the_newest_while_the_job_runs(
        client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    directory = backend.launches[0].checkpoint_dir
    save_steps(directory, {5: 0.6, 10: 0.7})
    base = f"/api/v1/jobs/{job['id']}/checkpoints"
    refused = client.delete(f"{base}/step-10", headers=AUTH)
    assert refused.status_code == 409 and "newest" in refused.text
    assert client.delete(f"{base}/step-5", headers=AUTH).status_code == 204
    assert listed(client, job["id"]) == ["step-10"] and not (directory / "step-5").exists()
    assert client.delete(f"{base}/step-5", headers=AUTH).status_code == 404
    assert client.delete(f"{base}/..%2F..%2Fmigrator.db", headers=AUTH).status_code == 404
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 202
    assert client.delete(f"{base}/step-10", headers=AUTH).status_code == 204  # it has ended
    assert listed(client, job["id"]) == []


def test_a_finished_jobs_checkpoints_are_pruned_to_the_final_and_the_best(
        client: TestClient, backend: FakeBackend) -> None:
    from api.reconciler import Reconciler
    from api.services.events import EventLog
    from tests.support import wait_for

    job = create_job(client)
    save_steps(backend.launches[0].checkpoint_dir, {5: 0.6, 10: 0.8, 15: 0.7, 20: None})
    app = client.app
    settings = app.state.settings.model_copy(update={"checkpoint_ttl": 0.05})
    pruner = Reconciler(app.state.engine, settings, backend, EventLog(lambda *_: None))
    pruner.reconcile_once()
    assert len(listed(client, job["id"])) == 4  # it runs: nothing is pruned

    assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 202

    def pruned() -> bool:
        Reconciler(app.state.engine, settings, backend, EventLog(lambda *_: None)
                   ).reconcile_once()
        return len(listed(client, job["id"])) < 4

    wait_for(pruned, what="the checkpoints to be pruned", timeout=30)
    assert listed(client, job["id"]) == ["step-20", "step-10"]  # the final, the best
    events = client.get(f"/api/v1/jobs/{job['id']}/events", headers=AUTH,
                        params={"type": "job"}).json()["data"]
    assert [e["data"]["removed"] for e in events
            if e["data"].get("type") == "checkpoints_pruned"] == [["step-5", "step-15"]]


def test_links_a_pod_planted_lead_out_of_its_job_nowhere(
        client: TestClient, backend: FakeBackend, tmp_path) -> None:
    from api.reconciler import Reconciler
    from api.services.events import EventLog
    from tests.support import wait_for

    victim, mine = create_job(client), create_job(client)
    theirs, ours = (launch.checkpoint_dir for launch in backend.launches)
    save_steps(theirs, {10: 0.1})
    save_steps(ours, {5: 0.5, 20: 0.6})
    secret = tmp_path / "secret"
    secret.write_text("not theirs to read")
    (ours / "step-1").symlink_to(theirs / "step-10", target_is_directory=True)
    (ours / "step-20" / "extra.pt").symlink_to(secret)
    base = f"/api/v1/jobs/{mine['id']}/checkpoints"

    assert listed(client, mine["id"]) == ["step-20", "step-5"]
    for method, url in (("GET", f"{base}/step-1/download"), ("DELETE", f"{base}/step-1"),
                        ("POST", f"{base}/step-1/download-link")):
        assert client.request(method, url, headers=AUTH).status_code == 404, url
    for method, url in (("GET", f"{base}/step-20/download"),
                        ("POST", f"{base}/step-20/download-link")):
        refused = client.request(method, url, headers=AUTH)
        assert refused.status_code == 409, url
        assert "extra.pt" in refused.json()["detail"] and "not follow" in refused.text

    # Pruning (the final and the best stay) and deleting take this job's own files alone.
    assert client.post(f"/api/v1/jobs/{mine['id']}/cancel", headers=AUTH).status_code == 202
    settings = client.app.state.settings.model_copy(update={"checkpoint_ttl": 0.05})

    def pruned() -> bool:
        Reconciler(client.app.state.engine, settings, backend, EventLog(lambda *_: None)
                   ).reconcile_once()
        return listed(client, mine["id"]) == ["step-20"]

    wait_for(pruned, what="the checkpoints to be pruned", timeout=30)
    assert client.delete(f"{base}/step-20", headers=AUTH).status_code == 204
    assert listed(client, mine["id"]) == []
    assert (ours / "step-1").is_symlink() and secret.read_text() == "not theirs to read"
    assert listed(client, victim["id"]) == ["step-10"]
    restored = client.get(f"/api/v1/jobs/{victim['id']}/checkpoints/step-10/download",
                          headers=AUTH)
    assert restored.status_code == 200


def plant(object_store: Store, url: str, key: str) -> None:
    """Write `key` under `url` as a pod could, bypassing the client that would refuse it."""
    bucket, _, prefix = url.removeprefix(object_store.url_prefix).partition("/")
    if object_store.kind == "s3":  # moto's server takes an unsigned PUT
        quoted = "/".join(urllib.parse.quote(part, safe="") for part in f"{prefix}/{key}"
                          .split("/")).replace(".", "%2E")
        request = urllib.request.Request(f"{object_store.env['AWS_ENDPOINT_URL']}/{bucket}/"
                                         f"{quoted}", data=b"x", method="PUT")
        urllib.request.urlopen(request, timeout=30).close()
    else:
        from azure.storage.blob import BlobServiceClient

        connection = object_store.env["AZURE_STORAGE_CONNECTION_STRING"]
        with BlobServiceClient.from_connection_string(connection) as client:
            client.get_blob_client(bucket, f"{prefix}/{key}").upload_blob(b"x")


def test_keys_that_are_no_paths_get_a_clear_error_in_a_store(
        object_store: Store, tmp_path, inputs_dir) -> None:
    from api.app import create_app
    from api.settings import Settings
    from tests.api.conftest import ADMIN_TOKEN

    settings = Settings(data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN,
                        inputs_dir=inputs_dir, reconcile_interval=3600,
                        artifacts_url=object_store.new_location("keys") + "/jobs")
    backend = FakeBackend()
    with TestClient(create_app(settings, backend)) as client:
        job = create_job(client)
        directory = backend.launches[0].checkpoint_dir
        save_steps(directory, {5: 0.5})
        base = f"/api/v1/jobs/{job['id']}/checkpoints"
        # S3: obstore refuses to list a prefix holding `..` at all; Azure's names refuse
        # `..`, and an empty segment is left out of every copy.
        bad = "../../escape" if object_store.kind == "s3" else "nested//escape"
        plant(object_store, str(directory / "step-5"), bad)
        response = client.get(f"{base}/step-5/download", headers=AUTH)
        assert response.status_code == 409, response.text
        assert ("no path" if object_store.kind == "s3" else bad) in response.json()["detail"]
        assert client.get(base, headers=AUTH).status_code == (
            409 if object_store.kind == "s3" else 200)
