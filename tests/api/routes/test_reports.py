from fastapi.testclient import TestClient

from tests.api.conftest import AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend
from tests.factories import completed, evaluation, record
from trainer.contract.records import Started, StepSkipped


def test_reports_update_progress_and_are_idempotent(client: TestClient,
                                                    backend: FakeBackend) -> None:
    job = create_job(client, epochs=2)
    started = record(1, Started(message="go", step=0, epoch=1, samples={"train": 800},
                                parameters={"trainable": 4_226, "total": 82_180}))
    first = report(client, backend, job["id"], [started, metric(2, 1), metric(3, 2)])
    assert first == {"accepted": 3, "duplicates": 0}
    # A retried batch overlapping the first: only the new record is stored.
    again = report(client, backend, job["id"], [metric(2, 1), metric(3, 2), metric(4, 3)])
    assert again == {"accepted": 1, "duplicates": 2}
    state = client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()
    assert state["status"] == "running"
    assert state["progress"]["step"] == 3 and state["progress"]["samples_seen"] == 48
    assert state["progress"]["total_samples"] == 1600
    assert state["progress"]["eta_seconds"] == (1600 - 48) / 32.0
    assert state["metrics"]["loss"] == 0.5
    assert (state["metrics"]["trainable_parameters"], state["metrics"]["parameters"]) == (
        4_226, 82_180)  # what the job page shows
    assert state["pods"][0]["step"] == 3 and state["pods"][0]["last_heartbeat"] is not None
    metrics = client.get(f"/api/v1/jobs/{job['id']}/events?type=metric", headers=AUTH).json()
    assert [e["data"]["step"] for e in metrics["data"]] == [1, 2, 3]
    # A new incarnation of the pod starts its seq at 1 again and is not a duplicate.
    assert report(client, backend, job["id"], [metric(1, 4)], incarnation="i2")["accepted"] == 1


def test_evaluations_and_completion(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    report(client, backend, job["id"], [record(1, evaluation()), record(2, completed())])
    state = client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()
    assert (state["metrics"]["val_accuracy"], state["metrics"]["val_f1"]) == (0.8, 0.81)
    events = client.get(f"/api/v1/jobs/{job['id']}/events?type=job", headers=AUTH).json()
    assert any(e["data"].get("type") == "completed" and e["data"]["pod"] == f"{job['id']}-0"
               for e in events["data"])


def test_skipped_steps_are_events_and_counted_on_the_job(client: TestClient,
                                                         backend: FakeBackend) -> None:
    job = create_job(client, nonfinite_loss="skip")
    assert job["spec"]["nonfinite_loss"] == "skip"
    skips = [StepSkipped(message="step 12 skipped: loss became nan at step 12", step=12,
                         epoch=1, non_finite="nan", skipped=1),
             StepSkipped(message="step 40 skipped: the gradients became inf at step 40 (loss "
                                 "0.6931)", step=40, epoch=2, non_finite="inf", loss=0.6931,
                         skipped=2)]
    report(client, backend, job["id"], [metric(1, 11), record(2, skips[0]), metric(3, 13),
                                        record(4, skips[1])])
    state = client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()
    assert state["metrics"]["skipped_steps"] == 2 and state["progress"]["step"] == 13
    events = client.get(f"/api/v1/jobs/{job['id']}/events?type=job", headers=AUTH).json()
    assert [(e["data"]["step"], e["data"]["non_finite"]) for e in events["data"]
            if e["data"].get("type") == "step_skipped"] == [(12, "nan"), (40, "inf")]


def test_report_tokens_are_per_job(client: TestClient, backend: FakeBackend) -> None:
    first, second = create_job(client), create_job(client)
    token_of_first = backend.launches[0].report_token
    body = {"pod": f"{second['id']}-0", "incarnation": "i", "records": [metric(1, 1)]}
    crossed = client.post(f"/api/v1/jobs/{second['id']}/reports", json=body,
                          headers={"Authorization": f"Bearer {token_of_first}"})
    assert crossed.status_code == 403
    admin = client.post(f"/api/v1/jobs/{second['id']}/reports", json=body, headers=AUTH)
    assert admin.status_code == 403  # the admin token is not a report token
    assert client.post(f"/api/v1/jobs/{second['id']}/reports", json=body).status_code == 401
    assert first["id"] != second["id"]


def test_bad_reports(client: TestClient, backend: FakeBackend, settings) -> None:
    job = create_job(client)
    headers = {"Authorization": f"Bearer {backend.launches[0].report_token}"}
    url = f"/api/v1/jobs/{job['id']}/reports"
    unknown_pod = client.post(url, headers=headers, json={
        "pod": "someone-else", "incarnation": "i", "records": [metric(1, 1)]})
    assert unknown_pod.status_code == 422 and "no pod named" in unknown_pod.text
    malformed = client.post(url, headers=headers, json={"pod": f"{job['id']}-0",
                                                        "incarnation": "i", "records": [{}]})
    assert malformed.status_code == 422
    not_json = client.post(url, headers=headers, content=b"{nope")
    assert not_json.status_code == 422
    huge = b'{"pod": "' + b"x" * settings.max_report_bytes + b'"}'
    assert client.post(url, headers=headers, content=huge).status_code == 413

    def chunked():  # no Content-Length: counted while read, refused at the limit
        yield huge

    too_large = client.post(url, headers=headers, content=chunked())
    assert too_large.status_code == 413 and too_large.json()["error"] == "payload_too_large"


def test_dropped_records_are_recorded(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    response = client.post(f"/api/v1/jobs/{job['id']}/reports",
                           headers={"Authorization": f"Bearer {backend.launches[0].report_token}"},
                           json={"pod": f"{job['id']}-1", "incarnation": "i", "dropped": 7,
                                 "records": []})
    assert response.status_code == 200
    logs = client.get(f"/api/v1/jobs/{job['id']}/events?type=log", headers=AUTH).json()["data"]
    assert "7 metric records" in logs[0]["data"]["message"]


def test_the_token_is_checked_before_the_body(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    url = f"/api/v1/jobs/{job['id']}/reports"
    wrong = {"Authorization": "Bearer not-the-report-token"}
    assert client.post(url, headers=wrong, content=b"{not json").status_code == 403
    assert client.post(url, content=b"{not json").status_code == 401
    # An unknown job answers like a wrong token: nobody learns which job ids exist.
    unknown = client.post("/api/v1/jobs/job-00000000/reports", headers=wrong,
                          json={"pod": "p", "incarnation": "i", "records": []})
    known = client.post(url, headers=wrong, json={"pod": "p", "incarnation": "i", "records": []})
    assert (unknown.status_code, known.status_code) == (403, 403)
    assert unknown.json()["detail"].replace("job-00000000", job["id"]) == known.json()["detail"]
