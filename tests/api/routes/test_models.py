import io
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from tests.api.conftest import AUTH, create_job, report
from tests.api.fakes import FakeBackend
from tests.api.test_reconciler import reconcile
from tests.factories import completed, record
from trainer import lora
from trainer.checkpoint import save_checkpoint
from trainer.config import JobSpec
from trainer.contract.checkpoints import ADAPTER_DIR


@pytest.fixture
def model_id(client: TestClient, backend: FakeBackend, tiny_model_dir: Path) -> str:
    job = create_job(client)
    shutil.copytree(tiny_model_dir, backend.launches[0].model_dir)
    report(client, backend, job["id"], [record(1, completed("x"))])
    reconcile(client, backend)
    return client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()["model_id"]


def test_list_and_read(client: TestClient, model_id: str) -> None:
    listing = client.get("/api/v1/models", headers=AUTH).json()
    assert listing["count"] == 1 and listing["data"][0]["id"] == model_id
    model = client.get(f"/api/v1/models/{model_id}", headers=AUTH).json()
    assert model["links"]["download"] == f"/api/v1/models/{model_id}/download"
    assert "path" not in model  # server paths stay private
    assert client.get("/api/v1/models/model-nope", headers=AUTH).status_code == 404


def test_download_is_a_loadable_archive(client: TestClient, model_id: str,
                                        tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    response = client.get(f"/api/v1/models/{model_id}/download", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/gzip"
    assert f'filename="{model_id}.tar.gz"' in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        names = archive.getnames()
        assert all(name.startswith(f"{model_id}/") for name in names)
        archive.extractall(tmp_path, filter="data")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / model_id)
    assert loaded.config.num_labels == 2


def test_predict(client: TestClient, model_id: str) -> None:
    response = client.post(f"/api/v1/models/{model_id}/predict", headers=AUTH,
                           json={"texts": ["a good film", "a dull plot"]})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == 2
    assert all(0.0 <= p["score"] <= 1.0 and p["label"] for p in predictions)
    for body in ({"texts": []}, {"texts": [""]}, {"texts": ["x"] * 65}, {"text": "x"}):
        assert client.post(f"/api/v1/models/{model_id}/predict", headers=AUTH,
                           json=body).status_code == 422
    assert client.post("/api/v1/models/model-nope/predict", headers=AUTH,
                       json={"texts": ["x"]}).status_code == 404


def test_downloads_take_a_signed_link_instead_of_the_token(client: TestClient, model_id: str,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    path = f"/api/v1/models/{model_id}/download"
    token = AUTH["Authorization"].removeprefix("Bearer ")
    assert client.get(f"{path}?token={token}").status_code == 401  # never in a URL
    link = client.post(f"/api/v1/models/{model_id}/download-link", headers=AUTH).json()
    assert link["url"].startswith(f"{path}?expires=") and token not in link["url"]
    assert client.get(link["url"]).status_code == 200  # no header needed
    assert client.post(f"/api/v1/models/{model_id}/download-link").status_code == 401
    assert client.post("/api/v1/models/model-nope/download-link", headers=AUTH).status_code == 404

    # The signature covers the path and the expiry: neither can be changed, nor outlived.
    other = link["url"].replace(model_id, "model-other")
    assert client.get(other).status_code == 403
    expires = link["url"].split("expires=")[1].split("&")[0]
    later = link["url"].replace(f"expires={expires}", f"expires={int(expires) + 3600}")
    assert client.get(later).status_code == 403
    import time

    monkeypatch.setattr(time, "time", lambda: float(expires) + 1)
    expired = client.get(link["url"])
    assert expired.status_code == 403 and "expired" in expired.json()["detail"]


def test_a_lora_models_adapter_downloads_alone(client: TestClient, backend: FakeBackend,
                                               model_id: str, tiny_model_dir: Path,
                                               tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    path = f"/api/v1/models/{model_id}/download?format=adapter"
    missing = client.get(path, headers=AUTH)  # a full fine-tune has none
    assert missing.status_code == 404 and "adapter" in missing.text
    assert client.get(f"/api/v1/models/{model_id}/download?format=onnx",
                      headers=AUTH).status_code == 422

    # A LoRA job's export: the merged model, and its adapters beside it.
    job = create_job(client, finetune="lora")
    lora_dir = backend.launches[-1].model_dir
    shutil.copytree(tiny_model_dir, lora_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    lora.apply_lora(model, JobSpec(model="tiny", finetune="lora")).save_pretrained(
        lora_dir / ADAPTER_DIR)
    report(client, backend, job["id"], [record(1, completed("x"))])
    reconcile(client, backend)
    lora_model = client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()["model_id"]
    link = client.post(f"/api/v1/models/{lora_model}/download-link?format=adapter",
                       headers=AUTH).json()
    response = client.get(link["url"])  # the signed link keeps the format
    assert response.status_code == 200
    assert f'filename="{lora_model}-adapter.tar.gz"' in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        assert "adapter_config.json" in {Path(name).name for name in archive.getnames()}
        assert not any(name.endswith("config.json") and "adapter" not in name
                       for name in archive.getnames())
        archive.extractall(tmp_path, filter="data")
    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    assert isinstance(PeftModel.from_pretrained(base, tmp_path / f"{lora_model}-adapter"),
                      PeftModel)


def test_a_deleted_model_is_gone_with_its_files(client: TestClient, model_id: str,
                                                backend: FakeBackend) -> None:
    files = backend.launches[0].model_dir
    assert client.post(f"/api/v1/models/{model_id}/predict", headers=AUTH,
                       json={"texts": ["fine"]}).status_code == 200  # cached for predictions
    assert client.delete(f"/api/v1/models/{model_id}").status_code == 401
    assert client.delete(f"/api/v1/models/{model_id}", headers=AUTH).status_code == 204
    assert not files.exists()
    assert client.get(f"/api/v1/models/{model_id}", headers=AUTH).status_code == 404
    assert client.post(f"/api/v1/models/{model_id}/predict", headers=AUTH,
                       json={"texts": ["fine"]}).status_code == 404
    assert client.get("/api/v1/models", headers=AUTH).json()["count"] == 0
    job = client.get(f"/api/v1/jobs/{backend.launches[0].job_id}", headers=AUTH).json()
    assert job["model_id"] is None  # the job's record stays
    assert client.delete(f"/api/v1/models/{model_id}", headers=AUTH).status_code == 404


def test_a_model_holding_a_link_is_neither_served_nor_loaded(
        client: TestClient, model_id: str, backend: FakeBackend, tmp_path: Path) -> None:
    files = backend.launches[0].model_dir
    secret = tmp_path / "secret"
    secret.write_text("[PAD]\nnot theirs to read\n")
    (files / "vocab.txt").unlink()
    (files / "vocab.txt").symlink_to(secret)  # what a tokenizer would read as its vocabulary
    base = f"/api/v1/models/{model_id}"
    for method, url, body in (("GET", f"{base}/download", None),
                              ("GET", f"{base}/download?format=adapter", None),
                              ("POST", f"{base}/download-link", None),
                              ("POST", f"{base}/predict", {"texts": ["fine"]})):
        refused = client.request(method, url, headers=AUTH, json=body)
        assert refused.status_code == 409, url
        assert "vocab.txt" in refused.json()["detail"] and "not follow" in refused.text

    assert client.delete(base, headers=AUTH).status_code == 204
    assert not files.exists() and secret.read_text() == "[PAD]\nnot theirs to read\n"


def test_a_model_directory_linked_to_another_jobs_is_not_registered_nor_deleted(
        client: TestClient, model_id: str, backend: FakeBackend, settings) -> None:
    """The Kubernetes layout: the API links a job's directories to its sub-directories of the
    volumes, which its pods write; there a pod replaces its model by a link to another job's,
    and leaves a link to that job in its job's directory too."""
    theirs = backend.launches[0].model_dir
    mine = create_job(client)
    launch = backend.launches[-1]
    volume = settings.resolved_volumes_dir
    for name, path in (("checkpoints", launch.checkpoint_dir), ("models", launch.model_dir)):
        (volume / name / mine["id"]).mkdir(parents=True)
        target = volume / name / mine["id"] / ("model" if name == "models" else "")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target, target_is_directory=True)  # as KubernetesBackend links them
    save_checkpoint(volume / "checkpoints" / mine["id"], 5, {"w": torch.ones(1)}, {}, {})
    (volume / "models" / mine["id"] / "model").symlink_to(theirs, target_is_directory=True)
    (settings.jobs_dir / mine["id"] / "theirs").symlink_to(theirs.parent)

    checkpoints = client.get(f"/api/v1/jobs/{mine['id']}/checkpoints", headers=AUTH).json()
    assert [c["id"] for c in checkpoints] == ["step-5"]  # the API's own link is followed
    report(client, backend, mine["id"], [record(1, completed("x"))])
    reconcile(client, backend)
    assert client.get(f"/api/v1/jobs/{mine['id']}", headers=AUTH).json()["model_id"] is None

    assert client.post(f"/api/v1/jobs/{mine['id']}/cancel", headers=AUTH).status_code == 202
    assert client.delete(f"/api/v1/jobs/{mine['id']}?delete_artifacts=true",
                         headers=AUTH).status_code == 204
    assert not (settings.jobs_dir / mine["id"]).exists()
    assert not (volume / "checkpoints" / mine["id"]).exists()
    assert not (volume / "models" / mine["id"] / "model").is_symlink()
    assert (theirs / "config.json").is_file()
    assert client.get(f"/api/v1/models/{model_id}/download", headers=AUTH).status_code == 200
