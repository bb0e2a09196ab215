import io
import tarfile

import torch
from fastapi.testclient import TestClient

from tests.api.conftest import AUTH, create_job
from tests.api.fakes import FakeBackend
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


def test_unknown_or_malicious_ids_are_404(client: TestClient) -> None:
    job = create_job(client)
    base = f"/api/v1/jobs/{job['id']}/checkpoints"
    assert client.get(base, headers=AUTH).json() == []
    for bad in ("step-99", "..%2F..%2Fadmin_token", "step-1.tmp", "%2Fetc%2Fpasswd"):
        assert client.get(f"{base}/{bad}/download", headers=AUTH).status_code == 404, bad
    assert client.get("/api/v1/jobs/job-nope/checkpoints", headers=AUTH).status_code == 404
