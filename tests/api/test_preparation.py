"""A `preparing` job (api.services.preparation) against the fake backend: the reconciler moves
its stagings on each pass, reads their progress, and launches it once they are staged, or fails
it with the reason. tests/api/test_staging.py runs real initializers against a hub mirror."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from api.backends.base import BackendError
from api.settings import Settings
from tests.api.conftest import AUTH, create_job
from tests.api.fakes import FakeBackend
from tests.api.test_reconciler import job_state, reconcile
from trainer.contract.staged import STAGED_FILE, progress_file, staged_dir

MODEL = "acme/bert"


def stage(settings: Settings, backend: FakeBackend, index: int, files: list[str]) -> None:
    """What an initializer leaves when it succeeds: the staged directory, whole."""
    request = backend.stagings[index]
    directory = staged_dir(settings.resolved_inputs_dir, request.kind, request.repo_id)
    directory.mkdir(parents=True)
    for name in files:
        (directory / name).write_text("{}")
    (directory / STAGED_FILE).write_text(json.dumps(
        {"commit": "c" * 40, "files": files, "bytes": 1234}))
    backend.end_staging(request.staging_id)


def write_config(settings: Settings, layers: int) -> None:
    directory = staged_dir(settings.resolved_inputs_dir, "model", MODEL)
    (directory / "config.json").write_text(json.dumps({
        "model_type": "bert", "num_hidden_layers": layers, "max_position_embeddings": 512,
        "hidden_size": 64, "num_attention_heads": 2}))


def test_a_preparing_job_shows_progress_and_launches_once_everything_is_staged(
        client: TestClient, backend: FakeBackend, settings: Settings) -> None:
    job = create_job(client, model=MODEL, dataset="reviews.csv")
    assert job["status"] == "preparing" and backend.launches == []
    model = backend.stagings[0]
    assert (model.kind, model.repo_id, model.revision) == ("model", MODEL, "main")
    progress = progress_file(settings.resolved_inputs_dir, model.staging_id)
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.write_text(json.dumps({"state": "running", "bytes_done": 300,
                                    "bytes_total": 1200, "files": 4}))
    reconcile(client, backend)
    shown = client.get(f"/api/v1/stagings/{model.staging_id}", headers=AUTH).json()
    assert (shown["bytes_done"], shown["bytes_total"], shown["files"]) == (300, 1200, 4)
    assert shown["status"] == "running" and shown["eta_seconds"] is not None
    assert len(backend.stagings) == 1  # a pass starts no second initializer for it

    stage(settings, backend, 0, ["config.json", "model.safetensors"])
    write_config(settings, layers=4)
    reconcile(client, backend)  # staged: its splits are tokenized next
    tokens = backend.stagings[1]
    assert tokens.kind == "tokens" and json.loads(tokens.spec or "")["model"] == MODEL
    assert job_state(client, job["id"])["status"] == "preparing" and backend.launches == []
    stage(settings, backend, 1, [])
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "starting" and [launch.job_id for launch in backend.launches] == [
        job["id"]]
    messages = [e["data"]["message"] for e in client.get(
        f"/api/v1/jobs/{job['id']}/events?type=job", headers=AUTH).json()["data"]]
    assert messages[1].startswith(f"preparing: staging model {MODEL}@main")
    assert messages[2].startswith(f"staged model {MODEL}@main (1.2 kB), tokenized splits")
    # A second job on the same assets starts at once.
    assert create_job(client, model=MODEL, dataset="reviews.csv")["status"] == "starting"


def test_a_spec_the_staged_model_cannot_train_fails_before_tokenizing(
        client: TestClient, backend: FakeBackend, settings: Settings) -> None:
    job = create_job(client, model=MODEL, parallelism="pipeline", pipeline_stages=3,
                     replicas=1)
    stage(settings, backend, 0, ["config.json"])
    write_config(settings, layers=2)
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "failed" and state["reason"].startswith("pipeline_stages:")
    assert [request.kind for request in backend.stagings] == ["model"]


def test_a_failed_initializer_fails_the_job_and_the_next_job_tries_again(
        client: TestClient, backend: FakeBackend, settings: Settings) -> None:
    job = create_job(client, model=MODEL)
    request = backend.stagings[0]
    progress = progress_file(settings.resolved_inputs_dir, request.staging_id)
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.write_text(json.dumps({"state": "failed", "error": "RepositoryNotFoundError"}))
    backend.end_staging(request.staging_id)
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "failed"
    assert state["reason"] == f"staging model {MODEL}@main failed: RepositoryNotFoundError"
    again = create_job(client, model=MODEL)
    assert again["status"] == "preparing" and len(backend.stagings) == 2
    shown = client.get(f"/api/v1/stagings/{request.staging_id}", headers=AUTH).json()
    assert shown["status"] == "running" and shown["attempts"] == 2


def test_an_initializer_that_ends_without_an_outcome_is_started_again_then_given_up(
        client: TestClient, backend: FakeBackend, settings: Settings) -> None:
    """Killed, or started by a control plane that stopped since: no progress says failed."""
    job = create_job(client, model=MODEL)
    for attempt in (1, 2, 3):
        assert len(backend.stagings) == attempt
        backend.end_staging(backend.stagings[-1].staging_id)
        reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "failed"
    assert "ended 3 times without an outcome" in state["reason"]


def test_an_initializer_that_ends_between_the_two_looks_is_staged_not_started_again(
        client: TestClient, backend: FakeBackend, settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconciler looks for the staged directory, then asks whether the initializer runs:
    one that renamed its directory into place and ended in between succeeded."""
    job = create_job(client, model=MODEL)
    asked = backend.staging

    def ends_while_asked(staging_id: str) -> bool:
        if staging_id == backend.stagings[0].staging_id and not staged_dir(
                settings.resolved_inputs_dir, "model", MODEL).exists():
            stage(settings, backend, 0, ["config.json"])
        return asked(staging_id)

    monkeypatch.setattr(backend, "staging", ends_while_asked)
    reconcile(client, backend)
    rows = client.get("/api/v1/stagings", params={"kind": "model"}, headers=AUTH).json()["data"]
    assert [(row["status"], row["attempts"]) for row in rows] == [("succeeded", 1)]
    assert [r.kind for r in backend.stagings].count("model") == 1  # not started again
    assert job_state(client, job["id"])["status"] == "preparing"  # now the tokens


def test_cancelling_a_preparing_job(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client, model=MODEL)
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 202
    reconcile(client, backend)
    assert job_state(client, job["id"])["status"] == "cancelled" and backend.launches == []


def test_an_import_stages_a_repository_ahead_of_the_jobs_and_a_delete_frees_it(
        client: TestClient, backend: FakeBackend, settings: Settings) -> None:
    body = {"kind": "model", "repo_id": MODEL, "revision": "v2"}
    started = client.post("/api/v1/stagings", json=body, headers=AUTH)
    assert started.status_code == 202, started.text
    staging = started.json()
    assert started.headers["Location"] == f"/api/v1/stagings/{staging['id']}"
    assert (staging["status"], backend.stagings[0].revision) == ("running", "v2")
    refused = client.delete(f"/api/v1/stagings/{staging['id']}", headers=AUTH)
    assert refused.status_code == 409 and "running" in refused.text

    # No job waits for it: the reconciler moves it on all the same.
    directory = staged_dir(settings.resolved_inputs_dir, "model", MODEL, "v2")
    directory.mkdir(parents=True)
    (directory / STAGED_FILE).write_text(json.dumps({"files": ["config.json"], "bytes": 10}))
    backend.end_staging(staging["id"])
    reconcile(client, backend)
    shown = client.get(f"/api/v1/stagings/{staging['id']}", headers=AUTH).json()
    assert shown["status"] == "succeeded" and shown["bytes_done"] == 10
    again = client.post("/api/v1/stagings", json=body, headers=AUTH)
    assert again.status_code == 200 and len(backend.stagings) == 1

    assert client.delete(f"/api/v1/stagings/{staging['id']}", headers=AUTH).status_code == 204
    assert not directory.exists()
    assert client.get(f"/api/v1/stagings/{staging['id']}", headers=AUTH).status_code == 404
    assert client.delete(f"/api/v1/stagings/{staging['id']}", headers=AUTH).status_code == 404


def test_a_staging_the_backend_cannot_answer_for_leaves_the_others_to_end(
        client: TestClient, backend: FakeBackend, settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One initializer the backend cannot be asked about is left for the next pass; the
    others are recorded as they end (a push's end is its job's event)."""
    unreachable, staged = (client.post("/api/v1/stagings", headers=AUTH, json={
        "kind": "model", "repo_id": MODEL, "revision": revision}).json()
        for revision in ("v1", "v2"))
    directory = staged_dir(settings.resolved_inputs_dir, "model", MODEL, "v2")
    directory.mkdir(parents=True)
    (directory / STAGED_FILE).write_text(json.dumps({"files": ["config.json"], "bytes": 10}))
    backend.end_staging(staged["id"])
    asked = backend.staging

    def cannot_answer(staging_id: str) -> bool:
        if staging_id == unreachable["id"]:
            raise BackendError("the API server did not answer")
        return asked(staging_id)

    monkeypatch.setattr(backend, "staging", cannot_answer)
    for attempt in (1, 2):  # and a pass later, still unanswered: still running
        reconcile(client, backend)
        shown = {row["id"]: row["status"] for row in client.get(
            "/api/v1/stagings", headers=AUTH).json()["data"]}
        assert shown == {unreachable["id"]: "running", staged["id"]: "succeeded"}, attempt


def test_a_staging_a_job_reads_cannot_be_deleted(client: TestClient, backend: FakeBackend,
                                                  settings: Settings) -> None:
    job = create_job(client, model=MODEL)
    stage(settings, backend, 0, ["config.json"])
    write_config(settings, layers=4)
    reconcile(client, backend)
    model = backend.stagings[0].staging_id
    refused = client.delete(f"/api/v1/stagings/{model}", headers=AUTH)
    assert refused.status_code == 409 and job["id"] in refused.json()["detail"]
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 202
    assert client.delete(f"/api/v1/stagings/{model}", headers=AUTH).status_code == 204


@pytest.mark.parametrize("body", [
    {"kind": "model", "repo_id": "../../etc"},
    {"kind": "model", "repo_id": "acme/bert", "revision": "../main"},
    {"kind": "model", "repo_id": "acme/bert", "revision": ".."},
    {"kind": "dataset", "repo_id": "acme/..", "revision": "main"},
    {"kind": "tokens", "repo_id": "0123456789abcdef"},
    {"kind": "model"},
])
def test_an_import_of_something_else_is_a_422(client: TestClient, backend: FakeBackend,
                                              body: dict) -> None:
    assert client.post("/api/v1/stagings", json=body, headers=AUTH).status_code == 422
    assert backend.stagings == []


def test_a_job_names_the_revisions_it_trains_on(client: TestClient, backend: FakeBackend,
                                                settings: Settings) -> None:
    job = create_job(client, model=MODEL, model_revision="v2", dataset="imdb",
                     dataset_revision="refs-pr-3")
    assert job["status"] == "preparing"
    assert [(r.kind, r.repo_id, r.revision) for r in backend.stagings] == [
        ("model", MODEL, "v2"), ("dataset", "stanfordnlp/imdb", "refs-pr-3")]
    for revision, field in (("..", "model_revision"), ("a/b", "dataset_revision")):
        refused = client.post("/api/v1/jobs", json={"model": MODEL, field: revision},
                              headers=AUTH)
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["loc"][:2] == ["body", field]
