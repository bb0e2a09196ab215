import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.engine import Engine
from upath import UPath

from api.app import create_app
from api.backends.base import BackendError, WorkloadStatus
from api.reconciler import Reconciler
from api.services.events import EventLog
from api.settings import Settings
from tests.api.conftest import AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend
from tests.factories import completed, record
from tests.stores import Store
from trainer.contract import artifact_store
from trainer.contract.records import Quorum


def reconcile(client: TestClient, backend: FakeBackend) -> list[tuple[str, list[dict]]]:
    """One pass; what it published, per job."""
    published: list[tuple[str, list[dict]]] = []
    app = client.app
    events = EventLog(lambda job_id, items: published.append((job_id, items)))
    Reconciler(app.state.engine, app.state.settings, backend, events).reconcile_once()
    return published


def job_state(client: TestClient, job_id: str) -> dict:
    return client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()


def test_pod_changes_become_events_and_status(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    report(client, backend, job["id"], [metric(1, 1)])
    published = reconcile(client, backend)
    state = job_state(client, job["id"])
    assert [p["phase"] for p in state["pods"]] == ["Running", "Running"]
    assert state["status"] == "running"
    assert [item["data"]["phase"] for _, items in published for item in items] == [
        "Running", "Running"]

    backend.logs[(job["id"], 1)] = ["step 5", "Traceback ...", "RuntimeError: boom"]
    backend.set_pod(job["id"], 1, phase="Failed", exit_code=1)
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "degraded" and state["pods"][1]["exit_code"] == 1
    logs = client.get(f"/api/v1/jobs/{job['id']}/events?type=log", headers=AUTH).json()["data"]
    assert logs[0]["data"]["lines"][-1] == "RuntimeError: boom"

    backend.set_pod(job["id"], 1, phase="Running", restarts=1)
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "running" and state["pods"][1]["restarts"] == 1
    assert reconcile(client, backend) == []  # nothing changed, nothing new


def test_fewer_participants_than_replicas_is_degraded(client: TestClient,
                                                     backend: FakeBackend) -> None:
    job = create_job(client)
    step = iter(range(1, 100))

    def step_with(participants: int) -> None:
        report(client, backend, job["id"], [metric(next(step), 1, participants=participants)])
        reconcile(client, backend)

    step_with(2)
    assert job_state(client, job["id"])["status"] == "running"
    step_with(1)  # every pod runs, but one is still healing: not yet back in the quorum
    assert job_state(client, job["id"])["status"] == "degraded"
    step_with(2)
    assert job_state(client, job["id"])["status"] == "running"
    statuses = client.get(f"/api/v1/jobs/{job['id']}/events?type=job", headers=AUTH).json()
    assert [(e["data"]["status"], e["data"]["participants"]) for e in statuses["data"]
            if "participants" in e["data"]] == [("degraded", 1), ("running", 2)]


def test_a_pipeline_job_counts_pods_and_replicas_apart(client: TestClient,
                                                       backend: FakeBackend) -> None:
    """2 replicas x 2 stages: four pod rows; a replica (two pods) is one participant."""
    job = create_job(client, parallelism="pipeline", fault_tolerance="restart", replicas=2,
                     batch_size=8)
    report(client, backend, job["id"], [metric(1, 1, participants=2)], pod=3)
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert [(p["ordinal"], p["phase"]) for p in state["pods"]] == [
        (o, "Running") for o in range(4)]  # no stage pod is taken for a scaled-away one
    assert state["status"] == "running"
    assert client.post(f"/api/v1/jobs/{job['id']}/pods/3/kill", headers=AUTH).status_code == 202
    backend.set_pod(job["id"], 3, phase="Failed", exit_code=137)
    reconcile(client, backend)
    assert job_state(client, job["id"])["status"] == "degraded"  # a stage pod is down


def test_controller_giving_up_fails_the_job(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    backend.finish(job["id"], reason="pod x failed: bad input: unknown dataset")
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "failed" and "bad input" in state["reason"]
    assert state["finished_at"] is not None and backend.deleted == [job["id"]]


def test_vanished_workload_fails_the_job(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    del backend.workloads[job["id"]]
    reconcile(client, backend)
    assert "vanished" in job_state(client, job["id"])["reason"]


def test_each_pass_reconciles_a_job_before_it_observes_it(client: TestClient,
                                                          backend: FakeBackend) -> None:
    job = create_job(client)

    class Acting(FakeBackend):
        """Its controller recreates pod 1 in the reconcile step, as a backend's does."""

        def reconcile(self, job_id: str) -> None:
            super().reconcile(job_id)
            self.set_pod(job_id, 1, restarts=1)

    acting = Acting(workloads=backend.workloads)
    reconcile(client, acting)
    assert acting.reconciled == [job["id"]]
    assert job_state(client, job["id"])["pods"][1]["restarts"] == 1  # seen in the same pass


def test_a_job_whose_reconcile_fails_is_left_for_the_next_pass(client: TestClient,
                                                               backend: FakeBackend) -> None:
    job = create_job(client)

    class Unreachable(FakeBackend):
        def reconcile(self, job_id: str) -> None:
            raise BackendError("the supervisor could not be replaced yet")

    # What it observes (no workload) is not acted on: the reconcile broke off half way.
    assert reconcile(client, Unreachable()) == []
    assert job_state(client, job["id"])["status"] == "starting"
    reconcile(client, backend)
    assert [p["phase"] for p in job_state(client, job["id"])["pods"]] == ["Running"] * 2


def test_completion_registers_the_model_and_deletes_the_workload(
        client: TestClient, backend: FakeBackend, tiny_model_dir: Path) -> None:
    job = create_job(client, name="my model")
    model_dir = backend.launches[0].model_dir
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "metrics.json").write_text('{"metrics": {"test": {"accuracy": 0.9}}}')
    report(client, backend, job["id"], [record(1, completed(str(model_dir)))])
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert state["status"] == "succeeded" and backend.deleted == [job["id"]]
    assert [p["phase"] for p in state["pods"]] == ["Succeeded", "Succeeded"]
    model = client.get(f"/api/v1/models/{state['model_id']}", headers=AUTH).json()
    assert (model["name"], model["job_id"]) == ("my model", job["id"])
    assert model["metrics"]["test"]["accuracy"] == 0.9 and model["size_bytes"] > 0
    reconcile(client, backend)  # finished jobs are left alone
    assert backend.deleted == [job["id"]]


def ended_jobs_with_killed_exports(client: TestClient, backend: FakeBackend,
                                   tiny_model_dir: Path) -> list[Path | UPath]:
    """A succeeded and a cancelled job, each with a live export's staging left by a killed pod
    next to its model; their workloads are deleted, their pods not gone yet. The stagings."""
    ended, pods_still_end = [], backend.gone
    backend.gone = lambda job_id: False  # type: ignore[method-assign]
    for outcome in ("succeeded", "cancelled"):
        job = create_job(client)
        model_dir = backend.launches[-1].model_dir
        staging = model_dir.with_name("model.tmp-0123456789ab")
        for directory in (model_dir, staging):
            if isinstance(directory, UPath):
                artifact_store.upload(tiny_model_dir, directory)
            else:
                shutil.copytree(tiny_model_dir, directory)
        if outcome == "succeeded":
            report(client, backend, job["id"], [record(1, completed(str(model_dir)))])
        else:
            assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code \
                == 202
        reconcile(client, backend)
        assert job_state(client, job["id"])["status"] == outcome
        ended.append(staging)
    assert all(staging.exists() for staging in ended)  # a pod may still be writing there
    backend.gone = pods_still_end  # type: ignore[method-assign]
    return ended


def test_an_ended_jobs_export_staging_goes_with_its_workload(
        client: TestClient, backend: FakeBackend, tiny_model_dir: Path) -> None:
    stagings = ended_jobs_with_killed_exports(client, backend, tiny_model_dir)
    reconcile(client, backend)
    for staging in stagings:
        assert not staging.exists()
        assert sorted(p.name for p in staging.parent.iterdir()) == ["model"]
        assert (staging.parent / "model" / "config.json").is_file()


def test_a_kubernetes_jobs_export_staging_goes_from_its_volume_only(
        client: TestClient, backend: FakeBackend, settings: Settings, tmp_path: Path) -> None:
    """The job's model is a link to its volume (as the Kubernetes backend makes it): its
    staging is cleared there, and a link its pods planted is not followed out of it."""
    job = create_job(client)
    volume = settings.resolved_volumes_dir / "models" / job["id"]
    elsewhere = tmp_path / "another-job"
    for directory in (volume / "model.tmp-0123456789ab", elsewhere / "model.tmp-ba9876543210"):
        directory.mkdir(parents=True)
    (volume / "model").symlink_to(elsewhere / "model")
    link = backend.launches[0].model_dir
    link.parent.mkdir(parents=True)
    link.symlink_to(volume / "model")
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 202
    reconcile(client, backend)
    assert [p.name for p in volume.iterdir()] == ["model"]
    assert [p.name for p in elsewhere.iterdir()] == ["model.tmp-ba9876543210"]


@pytest.fixture
def in_a_store(settings: Settings, backend: FakeBackend,
               object_store: Store) -> Iterator[TestClient]:
    """The app with its jobs' artifacts in an object store."""
    settings.artifacts_url = object_store.new_location("artifacts") + "/live-migrator"
    with TestClient(create_app(settings, backend)) as test_client:
        yield test_client


def test_an_ended_jobs_export_staging_goes_with_its_workload_from_a_store(
        in_a_store: TestClient, backend: FakeBackend, tiny_model_dir: Path) -> None:
    stagings = ended_jobs_with_killed_exports(in_a_store, backend, tiny_model_dir)
    reconcile(in_a_store, backend)
    for staging in stagings:
        assert isinstance(staging, UPath) and not staging.exists()
        assert [p.name for p in artifact_store.entries(staging.parent)] == ["model"]


def test_completion_waits_for_every_pod_to_report(client: TestClient, backend: FakeBackend,
                                                  tiny_model_dir: Path) -> None:
    job = create_job(client)
    shutil.copytree(tiny_model_dir, backend.launches[0].model_dir)

    def reported(pod: int, primary: bool) -> None:
        report(client, backend, job["id"], [record(1, completed("x", primary), time.time())],
               pod=pod)

    reported(0, primary=True)
    reconcile(client, backend)
    assert job_state(client, job["id"])["status"] == "running"  # pod 1 may still be reporting
    assert backend.deleted == []
    reported(1, primary=False)
    reconcile(client, backend)
    assert job_state(client, job["id"])["status"] == "succeeded"


def test_a_cancel_during_a_pass_is_not_overwritten(client: TestClient,
                                                   backend: FakeBackend) -> None:
    job = create_job(client)
    observe = backend.status

    def cancelled_meanwhile(job_id: str):
        # The user cancels after the pass listed the job: it finds the workload gone.
        assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=AUTH).status_code == 202
        return observe(job_id)

    backend.status = cancelled_meanwhile  # type: ignore[method-assign]
    reconcile(client, backend)
    state = job_state(client, job["id"])
    assert (state["status"], state["reason"]) == ("cancelled", "cancelled by user")


def test_a_pass_during_a_cancels_deletion_leaves_the_job_cancelled(
        client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    delete = backend.delete

    def delete_slowly(job_id: str) -> None:
        # The pods end as the workload goes; a pass sees that before the cancel returns.
        delete(job_id)
        backend.workloads[job_id] = WorkloadStatus(present=False, finished=True,
                                                   reason="deleted")
        reconcile(client, backend)

    backend.delete = delete_slowly  # type: ignore[method-assign]
    response = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert response.status_code == 202, response.text
    state = job_state(client, job["id"])
    assert (state["status"], state["reason"]) == ("cancelled", "cancelled by user")


def test_a_failed_deletion_is_retried_by_the_reconciler(client: TestClient,
                                                        backend: FakeBackend) -> None:
    job = create_job(client)
    delete = backend.delete

    def unreachable(job_id: str) -> None:
        raise BackendError("the Kubernetes API is unreachable")

    backend.delete = unreachable  # type: ignore[method-assign]
    response = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert response.status_code == 202 and "retried" in response.json()["detail"]
    assert job_state(client, job["id"])["status"] == "cancelled"
    assert backend.active_jobs() == [job["id"]]  # still running
    backend.delete = delete  # type: ignore[method-assign]
    reconcile(client, backend)
    assert backend.active_jobs() == [] and backend.deleted == [job["id"]]


def test_a_finishing_job_is_read_by_its_completions_alone(client: TestClient,
                                                          backend: FakeBackend,
                                                          tiny_model_dir: Path) -> None:
    """While a job waits for its pods' completions, each pass looks them up with an indexed
    query, and reads none of the job's other events."""
    job = create_job(client)
    shutil.copytree(tiny_model_dir, backend.launches[0].model_dir)
    history = [record(seq, Quorum(message="q", quorum_id=seq, participants=2, step=seq))
               for seq in range(1, 2_001)]
    report(client, backend, job["id"], [*history, record(2_001, completed("x"), time.time())])
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]
    reads: list[tuple[str, Any]] = []

    def capture(_connection: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if re.search(r"\bFROM event\b", statement):
            reads.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        reconcile(client, backend)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert job_state(client, job["id"])["status"] == "running"  # pod 1 has not completed yet
    assert len(reads) == 1
    statement, parameters = reads[0]
    selected = statement.split("FROM")[0]
    assert not re.search(r"(SELECT|,)\s+event\.data\s*(,|$)", selected)  # no event read whole
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("SET enable_seqscan = off")  # a small table, else
        plan = " ".join(str(row) for row in connection.exec_driver_sql(
            f"EXPLAIN {'QUERY PLAN ' if connection.dialect.name == 'sqlite' else ''}"
            f"{statement}", parameters))
    assert "ix_event_job_id_type" in plan, plan


def test_a_pass_reads_as_much_for_fifty_jobs_as_for_five(client: TestClient,
                                                        backend: FakeBackend) -> None:
    """The pass's statements do not grow with the active jobs (two a job once made a pass at
    1,000 jobs take seconds), and a pass where nothing changed writes nothing."""
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]

    def statements_of_a_quiet_pass() -> list[str]:
        reconcile(client, backend)  # records the new jobs' pods as Running
        seen: list[str] = []

        def capture(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            seen.append(statement)

        event.listen(engine, "before_cursor_execute", capture)
        try:
            assert reconcile(client, backend) == []
        finally:
            event.remove(engine, "before_cursor_execute", capture)
        return seen

    for _ in range(5):
        create_job(client)
    five = statements_of_a_quiet_pass()
    for _ in range(45):
        create_job(client)
    fifty = statements_of_a_quiet_pass()
    # Five for the active jobs, their pods and migrations; one for the jobs `preparing`, one for
    # the stagings running (api.services.preparation, api.services.staging).
    assert len(fifty) == len(five) <= 7, fifty
    assert not [s for s in fifty if s.lstrip().upper().startswith(("INSERT", "UPDATE"))]
