"""POST /api/v1/jobs/{id}/finish: a job asked to finish early, its pods told in the replies to
their reports, and the epoch they agreed on (trainer.finish) taken back."""

from fastapi.testclient import TestClient

from tests.api.conftest import AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend
from tests.factories import record
from trainer.contract.records import Finishing, Started


def finish(client: TestClient, job_id: str, **body: object) -> dict:
    response = client.post(f"/api/v1/jobs/{job_id}/finish", headers=AUTH,
                           json=body if body else None)
    return {**response.json(), "code": response.status_code}


def test_a_job_asked_to_finish_tells_its_pods_and_takes_the_epoch_they_agreed_on(
        client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client, epochs=4, replicas=2)
    started = Started(message="started", step=0, epoch=1, samples={"train": 100})
    # 400 samples in all, 80 seen at 32 samples/s.
    reply = report(client, backend, job["id"], [record(1, started), metric(2, 5, epoch=2)])
    assert reply["finish_after_epoch"] is None
    shown = client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()["progress"]
    assert (shown["epochs"], shown["eta_seconds"]) == (4, 10.0)

    asked = finish(client, job["id"])  # no body: after the epoch under way
    assert asked["code"] == 202
    assert asked["detail"].startswith("asked to finish after epoch 2 of 4")
    shown = client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()["progress"]
    assert (shown["epochs"], shown["eta_seconds"]) == (2, 3.8)  # 120 samples left
    (event,) = [e["data"] for e in client.get(f"/api/v1/jobs/{job['id']}/events",
                                              params={"type": "job"}, headers=AUTH).json()["data"]
                if e["data"].get("type") == "finish_requested"]
    assert (event["epoch"], event["by"]) == (2, "admin")
    assert report(client, backend, job["id"], [metric(3, 6, epoch=2)],
                  pod=1)["finish_after_epoch"] == 2

    # The pods were past it when they agreed: the job ends after epoch 3, and says so.
    agreed = Finishing(message="finishing", epoch=3, step=100)
    assert report(client, backend, job["id"], [record(4, agreed)])["finish_after_epoch"] == 3
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()[
        "progress"]["epochs"] == 3
    again = finish(client, job["id"])
    assert again["code"] == 202 and "after epoch 3 of 4" in again["detail"]


def test_a_finish_that_cannot_be_taken_says_why_and_changes_nothing(
        client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client, epochs=4)
    late = finish(client, job["id"], after_epoch=5)
    assert late["code"] == 422 and "after_epoch" in str(late)
    assert "must be at most the job's epochs (4)" in str(late)
    for body in ({"after_epoch": 0}, {"after_epoch": "soon"}, {"epoch": 2}):
        assert finish(client, job["id"], **body)["code"] == 422, body
    assert finish(client, "job-nope")["code"] == 404
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()[
        "progress"]["epochs"] == 4

    assert finish(client, job["id"], after_epoch=2)["code"] == 202
    assert finish(client, job["id"], after_epoch=2)["code"] == 202  # the same: nothing new
    other = finish(client, job["id"], after_epoch=3)
    assert other["code"] == 409 and "already finishes after epoch 2" in other["detail"]

    elastic = create_job(client, fault_tolerance="live", elastic_batch=True)
    refused = finish(client, elastic["id"])
    assert refused["code"] == 409 and "elastic batch" in refused["detail"]
    client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    ended = finish(client, job["id"], after_epoch=2)
    assert ended["code"] == 409 and "already cancelled" in ended["detail"]
