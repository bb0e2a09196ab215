"""Scaling a job and migrating a pod, through the routes, against the in-memory backend."""

import time

from fastapi.testclient import TestClient

from api.reconciler import Reconciler
from tests.api.conftest import AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend
from tests.factories import record
from trainer.contract.records import Joined, Left


def reconcile(client: TestClient, backend: FakeBackend) -> None:
    app = client.app.state
    Reconciler(app.engine, app.settings, backend, app.events).reconcile_once()


def events_of(client: TestClient, job_id: str, *types: str) -> list[dict]:
    query = "".join(f"&type={t}" for t in types)
    return client.get(f"/api/v1/jobs/{job_id}/events?limit=1000{query}",
                      headers=AUTH).json()["data"]


def test_patch_scales_the_job_at_once_and_its_pods_follow(client: TestClient,
                                                          backend: FakeBackend) -> None:
    job = create_job(client, replicas=2, max_replicas=4)
    path = f"/api/v1/jobs/{job['id']}"
    up = client.patch(path, json={"replicas": 3}, headers=AUTH)
    assert up.status_code == 200, up.text
    assert up.json()["spec"]["replicas"] == 3
    assert [p["ordinal"] for p in up.json()["pods"]] == [0, 1, 2]
    assert up.json()["pods"][2]["phase"] == "Pending"
    assert backend.scales == [(job["id"], 3)]

    down = client.patch(path, json={"replicas": 1}, headers=AUTH).json()
    assert down["spec"]["replicas"] == 1
    # The pods scaled away stay listed until the backend no longer runs them.
    reconcile(client, backend)
    assert [p["ordinal"] for p in client.get(path, headers=AUTH).json()["pods"]] == [0]
    removed = [e for e in events_of(client, job["id"], "pod") if e["data"].get("phase") ==
               "Removed"]
    assert {e["data"]["ordinal"] for e in removed} == {1, 2}
    scaled = [e["data"] for e in events_of(client, job["id"], "job")
              if e["data"].get("type") == "scaled"]
    assert [(e["from"], e["to"]) for e in scaled] == [(2, 3), (3, 1)]
    # The global batch stays as submitted: two shards, so the third pod is a spare.
    assert up.json()["spec"]["global_batch_size"] == down["spec"]["global_batch_size"] == (
        2 * job["spec"]["batch_size"])
    assert "1 of them wait as warm spares" in scaled[0]["message"]
    assert "spares" not in scaled[1]["message"]

    # Back up: the ordinal's row is reused, its reports are accepted again.
    client.patch(path, json={"replicas": 2}, headers=AUTH)
    reconcile(client, backend)
    pods = client.get(path, headers=AUTH).json()["pods"]
    assert [(p["ordinal"], p["phase"]) for p in pods] == [(0, "Running"), (1, "Running")]
    report(client, backend, job["id"], [record(1, Joined(
        message="joined", pod=f"{job['id']}-1", step=4, epoch=1, participants=2))], pod=1)


def test_patch_bounds_states_and_unknown_jobs(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client, replicas=2)
    assert job["spec"]["max_replicas"] == 8
    path = f"/api/v1/jobs/{job['id']}"
    for body, field in (({"replicas": 9}, "replicas"), ({"replicas": 0}, "replicas"),
                        ({}, "replicas"), ({"replicas": 2, "epochs": 3}, "epochs")):
        response = client.patch(path, json=body, headers=AUTH)
        assert response.status_code == 422, body
        assert field in str(response.json()["detail"]), response.json()
    assert client.patch("/api/v1/jobs/job-nope", json={"replicas": 1},
                        headers=AUTH).status_code == 404
    created = client.post("/api/v1/jobs", json={"replicas": 3, "max_replicas": 2}, headers=AUTH)
    assert created.status_code == 422 and "max_replicas" in str(created.json()["detail"])
    same = client.patch(path, json={"replicas": 2}, headers=AUTH)
    assert same.status_code == 200 and backend.scales == []
    client.post(f"{path}/cancel", headers=AUTH)
    ended = client.patch(path, json={"replicas": 3}, headers=AUTH)
    assert ended.status_code == 409 and "cancelled" in ended.json()["detail"]
    assert backend.scales == []


def test_migrate_a_pod_and_the_report_that_completes_it(client: TestClient,
                                                       backend: FakeBackend) -> None:
    job = create_job(client, replicas=2)
    job_id, path = job["id"], f"/api/v1/jobs/{job['id']}/pods"
    early = client.post(f"{path}/1/migrate", headers=AUTH)
    assert early.status_code == 409 and "starting" in early.json()["detail"]
    report(client, backend, job_id, [record(1, Joined(
        message="joined", pod=f"{job_id}-1", step=1, epoch=1, participants=2))],
        pod=1, incarnation="0")  # the first report: the job runs
    for step in range(2, 8):
        report(client, backend, job_id, [metric(step - 1, step)], incarnation="0")

    response = client.post(f"{path}/1/migrate", headers=AUTH)
    assert response.status_code == 202, response.text
    assert backend.migrations == [(job_id, 1, None)]
    again = client.post(f"{path}/1/migrate", json={}, headers=AUTH)
    assert again.status_code == 409 and "already migrating" in again.json()["detail"]
    assert client.post(f"{path}/2/migrate", headers=AUTH).status_code == 404
    nowhere = client.post(f"{path}/0/migrate", json={"node": "node-x"}, headers=AUTH)
    assert nowhere.status_code == 422 and "node" in str(nowhere.json()["detail"])
    bad = client.post(f"{path}/0/migrate", json={"node": "Not A Node!"}, headers=AUTH)
    assert bad.status_code == 422

    # The old incarnation's reports do not complete it; the replacement's first step does.
    report(client, backend, job_id, [record(2, Joined(
        message="joined", pod=f"{job_id}-1", step=8, epoch=1, participants=2),
        time=time.time())], pod=1, incarnation="0")
    assert not [e for e in events_of(client, job_id, "job")
                if e["data"].get("type") == "migrated"]
    report(client, backend, job_id, [record(1, Joined(
        message="joined", pod=f"{job_id}-1", step=9, epoch=1, participants=3,
        heal_bytes=1000, heal_seconds=0.5), time=time.time())], pod=1, incarnation="1")
    report(client, backend, job_id, [record(3, Left(
        message="left", pod=f"{job_id}-1", step=9, epoch=1))], pod=1, incarnation="0")
    migrated = [e["data"] for e in events_of(client, job_id, "job")
                if e["data"].get("type") == "migrated"]
    assert len(migrated) == 1
    assert (migrated[0]["ordinal"], migrated[0]["old_incarnation"],
            migrated[0]["new_incarnation"], migrated[0]["steps_lost"]) == (1, "0", "1", 0)
    assert migrated[0]["seconds"] >= 0
    left = [e["data"] for e in events_of(client, job_id, "job") if e["data"].get("type") ==
            "left"]
    assert [e["reason"] for e in left] == ["migrate"]
    # Done: the pod may migrate again.
    backend.set_pod(job_id, 1, migrating=False)
    assert client.post(f"{path}/1/migrate", headers=AUTH).status_code == 202


def test_left_says_why(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client, replicas=3)
    job_id = job["id"]

    def leave(ordinal: int, seq: int) -> None:
        report(client, backend, job_id, [record(seq, Left(
            message="left", pod=f"{job_id}-{ordinal}", step=5, epoch=1))], pod=ordinal)

    leave(1, 1)  # a SIGTERM from outside (an eviction, a kill with a grace)
    client.patch(f"/api/v1/jobs/{job_id}", json={"replicas": 2}, headers=AUTH)
    leave(2, 1)
    reasons = {e["data"]["pod"]: e["data"]["reason"] for e in events_of(client, job_id, "job")
               if e["data"].get("type") == "left"}
    assert reasons == {f"{job_id}-1": "sigterm", f"{job_id}-2": "scale-down"}

