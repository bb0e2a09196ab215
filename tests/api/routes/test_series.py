"""`GET /api/v1/jobs/{id}/series` and the events list without metric points: what a job page
loads instead of its whole history."""

from fastapi.testclient import TestClient

from tests.api.conftest import AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend
from tests.factories import evaluation, record


def test_the_series_combines_pods_per_step_and_the_history_leaves_points_out(
        client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    report(client, backend, job["id"], [metric(1, 1, loss=0.9, participants=2),
                                        metric(2, 2, loss=0.7, samples_per_second=30.0),
                                        record(3, evaluation(epoch=1, accuracy=0.75))])
    report(client, backend, job["id"], [metric(1, 1, loss=0.5, participants=2),
                                        metric(2, 2, loss=0.3, samples_per_second=34.0)], pod=1)
    series = client.get(f"/api/v1/jobs/{job['id']}/series", headers=AUTH).json()
    assert series["steps"] == 2
    assert [(step, loss, rate, participants)
            for step, _time, loss, rate, participants in series["points"]] == [
        (1, 0.7, 32.0, 2), (2, 0.5, 32.0, 2)]  # the two pods' means
    assert series["latest"]["step"] == 2 and series["latest"]["pod"] == f"{job['id']}-1"
    assert series["latest"]["time"] == 1_700_000_002.0

    everything = client.get(f"/api/v1/jobs/{job['id']}/events", headers=AUTH,
                            params={"limit": 1000}).json()["data"]
    assert series["last_id"] == everything[-1]["id"]
    others = client.get(f"/api/v1/jobs/{job['id']}/events", headers=AUTH,
                        params={"points": "false", "before": series["last_id"] + 1}).json()
    kinds = [(e["type"], e["data"].get("kind")) for e in others["data"]]
    assert ("metric", "metric") not in kinds and ("metric", "eval") in kinds
    assert [e["id"] for e in others["data"]] == [
        e["id"] for e in everything if e["data"].get("kind") != "metric"]

    first = everything[0]["id"]
    before = client.get(f"/api/v1/jobs/{job['id']}/events", headers=AUTH,
                        params={"before": first + 1}).json()
    assert [e["id"] for e in before["data"]] == [first] and before["next_after"] is None


def test_a_long_history_comes_as_a_bounded_series_with_its_extremes(
        client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    steps = 3000
    records = [metric(step, step, loss=5.0 if step == 2345 else 1.0 - step / (2 * steps),
                      participants=1 if step == 1234 else 2)
               for step in range(1, steps + 1)]
    for start in range(0, steps, 1000):
        report(client, backend, job["id"], records[start:start + 1000])
    series = client.get(f"/api/v1/jobs/{job['id']}/series", headers=AUTH,
                        params={"points": 100}).json()
    assert series["steps"] == steps
    kept = {point[0]: point for point in series["points"]}
    assert len(kept) <= 102
    assert {1, steps} <= set(kept)  # the first and the last step
    assert kept[2345][2] == 5.0  # a loss spike survives
    assert kept[1234][4] == 1  # and so does a participant's dip
    assert series["latest"]["step"] == steps


def test_the_series_of_an_unknown_job_is_a_404_and_of_a_new_one_empty(
        client: TestClient) -> None:
    assert client.get("/api/v1/jobs/job-00000000/series", headers=AUTH).status_code == 404
    job = create_job(client)
    series = client.get(f"/api/v1/jobs/{job['id']}/series", headers=AUTH).json()
    assert series["steps"] == 0 and series["points"] == [] and series["latest"] is None
    assert client.get(f"/api/v1/jobs/{job['id']}/series", headers=AUTH,
                      params={"points": 5}).status_code == 422
