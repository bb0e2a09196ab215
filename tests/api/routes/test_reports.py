import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.app import create_app
from api.models import Event
from api.services.job_view import LIFECYCLE_RESERVE
from api.settings import Settings
from tests.api.conftest import AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend
from tests.api.live import serve
from tests.api.services.test_reports import POISON, refuse_in_database
from tests.api.test_reconciler import reconcile
from tests.factories import completed, evaluation, metric_data, record
from trainer.contract.records import MAX_SAMPLE_IDS, Quorum, Started, StepSkipped


def test_reports_update_progress_and_are_idempotent(client: TestClient,
                                                    backend: FakeBackend) -> None:
    job = create_job(client, epochs=2)
    started = record(1, Started(message="go", step=0, epoch=1, samples={"train": 800},
                                parameters={"trainable": 4_226, "total": 82_180}))
    first = report(client, backend, job["id"], [started, metric(2, 1), metric(3, 2)])
    assert first == {"accepted": 3, "duplicates": 0, "finish_after_epoch": None}
    # A retried batch overlapping the first: only the new record is stored.
    again = report(client, backend, job["id"], [metric(2, 1), metric(3, 2), metric(4, 3)])
    assert again == {"accepted": 1, "duplicates": 2, "finish_after_epoch": None}
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


METRIC = metric_data(1).model_dump(mode="json")
EVALUATION = evaluation().model_dump(mode="json")
STARTED = {"type": "started", "message": "go", "step": 0, "epoch": 1, "samples": {"train": 8}}
COMPLETED = completed().model_dump(mode="json")
SCORES = {"accuracy": 0.5, "loss": 0.7, "f1": 0.5, "samples": 10, "epoch": 1, "step": 5}


def one(kind: str, data: dict, time: float = 1.0) -> dict:
    """A batch's fields: one record."""
    return {"records": [{"seq": 1, "kind": kind, "time": time, "data": data}]}


POISONS: dict[str, tuple[dict, tuple]] = {  # what is wrong: (a batch's fields, the 422's loc)
    "a count past 64 bits": (one("event", {**STARTED, "samples": {"train": 2**64}}),
                             ("records", 0, "event", "data", "started", "samples", "train")),
    "a NaN loss": (one("metric", {**METRIC, "loss": float("nan")}),
                   ("records", 0, "metric", "data", "loss")),
    "an infinite rate": (one("metric", {**METRIC, "learning_rate": float("inf")}),
                         ("records", 0, "metric", "data", "learning_rate")),
    "a NaN time": (one("metric", METRIC, time=float("nan")), ("records", 0, "metric", "time")),
    "an accuracy above 1": (one("eval", {**EVALUATION, "accuracy": 2.0}),
                            ("records", 0, "eval", "data", "accuracy")),
    "a quorum id past 64 bits": (
        one("event", {"type": "quorum", "message": "q", "quorum_id": 2**63, "participants": 2,
                      "step": 1}), ("records", 0, "event", "data", "quorum", "quorum_id")),
    "too many sample ids": (
        one("samples", {"step": 1, "epoch": 1, "cursor": 0, "rank": 0, "window": [1],
                        "ids": [1] * (MAX_SAMPLE_IDS + 1)}),
        ("records", 0, "samples", "data", "ids")),
    "a NUL in a message": (one("event", {**STARTED, "message": "a\x00b"}),
                           ("records", 0, "event", "data", "started", "message")),
    "a line break in a pod's name": ({"pod": "pod\n0"}, ("pod",)),
    "an unknown figure in a completion": (
        one("event", {**COMPLETED, "metrics": {"test": {**SCORES, "x": 1}}}),
        ("records", 0, "event", "data", "completed", "metrics", "test", "x")),
}


def test_every_record_field_is_bounded(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    url = f"/api/v1/jobs/{job['id']}/reports"
    headers = {"Authorization": f"Bearer {backend.launches[0].report_token}",
               "Content-Type": "application/json"}
    for what, (fields, where) in POISONS.items():
        body = {"pod": f"{job['id']}-0", "incarnation": "i", "records": [], **fields}
        response = client.post(url, headers=headers, content=json.dumps(body))  # NaN as NaN
        assert response.status_code == 422, (what, response.text)
        assert [tuple(e["loc"]) for e in response.json()["detail"]] == [("body", *where)], what


def test_one_jobs_poisoned_batches_fail_alone(settings: Settings, backend: FakeBackend) -> None:
    """Two jobs report at once: the first's batches that fail validation, or in the database,
    get a 422 naming why; the second's are all stored, none answered late or with an error."""
    app = create_app(settings, backend)
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        poisoned, healthy = (http.post("/api/v1/jobs", json={}, headers=AUTH).json()["id"]
                             for _ in range(2))
        refuse_in_database(app.state.engine, poisoned)
        tokens = {launch.job_id: launch.report_token for launch in backend.launches}

        def post(job_id: str, body: dict) -> httpx.Response:
            body = {"pod": f"{job_id}-0", "incarnation": "i", "records": [], **body}
            return http.post(f"/api/v1/jobs/{job_id}/reports", content=json.dumps(body),
                             headers={"Authorization": f"Bearer {tokens[job_id]}",
                                      "Content-Type": "application/json"})

        database_poison = one("event", {**STARTED, "message": POISON})
        with ThreadPoolExecutor(8) as pool:
            refused = {what: pool.submit(post, poisoned, fields)
                       for what, (fields, _) in POISONS.items()}
            refused["refused by the database"] = pool.submit(post, poisoned, database_poison)
            stored = [pool.submit(post, healthy, {"incarnation": f"i{n}", "records": [
                metric(seq, n * 10 + seq) for seq in range(1, 6)]}) for n in range(20)]
            for what, future in refused.items():
                response = future.result()
                assert response.status_code == 422, (what, response.text)
            assert "the database refused this batch" in refused[
                "refused by the database"].result().text
            assert [future.result().status_code for future in stored] == [200] * 20
        metrics = http.get(f"/api/v1/jobs/{healthy}/events?type=metric", headers=AUTH).json()
        assert len(metrics["data"]) == 100
        assert http.get(f"/api/v1/jobs/{poisoned}/events?type=metric",
                        headers=AUTH).json()["data"] == []


def test_past_its_event_quota_a_job_keeps_its_progress_and_lifecycle(
        settings: Settings, backend: FakeBackend, tiny_model_dir: Path) -> None:
    quota = 20_000  # about 115 metric events
    app = create_app(settings.model_copy(update={"max_job_event_bytes": quota}), backend)
    with TestClient(app) as client:
        job, other = create_job(client)["id"], create_job(client)["id"]

        def post(job_id: str, records: list[dict]) -> httpx.Response:
            token = next(launch.report_token for launch in backend.launches
                         if launch.job_id == job_id)
            return client.post(f"/api/v1/jobs/{job_id}/reports",
                               headers={"Authorization": f"Bearer {token}"},
                               json={"pod": f"{job_id}-0", "incarnation": "i", "records": records})

        def events(job_id: str, type_: str) -> list[dict]:
            return client.get(f"/api/v1/jobs/{job_id}/events?type={type_}&limit=1000",
                              headers=AUTH).json()["data"]

        metrics = [metric(seq, seq) for seq in range(1, 201)]
        over = post(job, metrics)
        assert over.status_code == 429 and over.json()["error"] == "quota_exceeded"
        assert f"event quota of {quota} bytes" in over.json()["detail"]
        assert "MIGRATOR_MAX_JOB_EVENT_BYTES" in over.json()["detail"]
        stored = events(job, "metric")
        assert 100 < len(stored) < 200 and stored[-1]["data"]["step"] == len(stored)
        # Its sender retries the batch, as after any 429: the refused records stay refused.
        assert post(job, metrics).json() == {"accepted": 0, "duplicates": 200,
                                          "finish_after_epoch": None}
        assert client.get(f"/api/v1/jobs/{job}", headers=AUTH).json()["progress"]["step"] == 200
        # Past the quota, a pod still hears an early finish: in the reply to the retry.
        assert client.post(f"/api/v1/jobs/{job}/finish", headers=AUTH,
                           json={"after_epoch": 1}).status_code == 202
        assert post(job, metrics).json()["finish_after_epoch"] == 1

        model_dir = backend.launches[0].model_dir
        shutil.copytree(tiny_model_dir, model_dir)
        last = [metric(201, 201), record(202, completed(str(model_dir)))]
        assert post(job, last).status_code == 429  # the metric was refused, the completion not
        assert post(job, []).status_code == 200  # nor are heartbeats
        assert [e["data"]["type"] for e in events(job, "job") if "type" in e["data"]] == [
            "finish_requested", "completed"]  # lifecycle events, stored past the quota
        assert len(events(job, "metric")) == len(stored)
        warnings = [e for e in events(job, "log") if e["data"].get("quota_bytes") == quota]
        assert len(warnings) == 1 and "reached its event quota" in warnings[0]["data"]["message"]
        reconcile(client, backend)  # the quota does not keep the job from finishing
        assert client.get(f"/api/v1/jobs/{job}", headers=AUTH).json()["status"] == "succeeded"

        # Lifecycle events have a reserve of their own, bounded too.
        quorums = [record(seq, Quorum(message="q" * 2_000, quorum_id=seq, participants=2,
                                      step=1)) for seq in range(203, 223)]
        assert post(job, quorums).status_code == 429
        with Session(app.state.engine) as session:
            sizes = session.exec(select(Event.size).where(Event.job_id == job)).all()
        assert sum(sizes) <= quota + quota // LIFECYCLE_RESERVE + 1_000  # the control plane's
        # Another job's reports are its own.
        assert post(other, metrics[:10]).json() == {"accepted": 10, "duplicates": 0,
                                                 "finish_after_epoch": None}
