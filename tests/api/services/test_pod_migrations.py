"""A migration's life (api/services/pod_migrations.py): started by the route, completed by the
report of its replacement, failed by the reconciler once MIGRATION_TIMEOUT passed with the pod no
longer migrating. Its completion through reports is tests/api/routes/test_elastic.py's."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.backends.base import MIGRATION_TIMEOUT
from api.models import Migration
from api.reconciler import Reconciler
from tests.api.conftest import AUTH, create_job, metric, report
from tests.api.fakes import FakeBackend


def migrations_of(client: TestClient, job_id: str) -> list[Migration]:
    with Session(client.app.state.engine) as session:
        return list(session.exec(select(Migration).where(Migration.job_id == job_id)))


def age(client: TestClient, job_id: str, seconds: float) -> None:
    """Make the job's migrations `seconds` older, as if requested that long ago."""
    with Session(client.app.state.engine) as session:
        for migration in session.exec(select(Migration).where(Migration.job_id == job_id)):
            migration.requested_at -= seconds
            session.add(migration)
        session.commit()


def failures(client: TestClient, job_id: str) -> list[dict]:
    events = client.get(f"/api/v1/jobs/{job_id}/events?type=job&limit=1000",
                        headers=AUTH).json()["data"]
    return [e["data"] for e in events if e["data"].get("type") == "migration_failed"]


def test_a_migration_fails_once_its_replacement_is_gone_past_the_timeout(
        client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client, replicas=2)
    job_id = job["id"]
    report(client, backend, job_id, [metric(1, 1)])  # the job runs
    app = client.app.state
    reconciler = Reconciler(app.engine, app.settings, backend, app.events)

    started = client.post(f"/api/v1/jobs/{job_id}/pods/1/migrate", headers=AUTH)
    assert started.status_code == 202, started.text
    [migration] = migrations_of(client, job_id)
    assert (migration.status, migration.ordinal, migration.old_incarnation) == (
        "pending", 1, "0")

    # Still migrating past the timeout, or not migrating but within it: still pending.
    age(client, job_id, MIGRATION_TIMEOUT + 1)
    reconciler.reconcile_once()
    backend.set_pod(job_id, 1, migrating=False)
    age(client, job_id, -(MIGRATION_TIMEOUT + 1) + MIGRATION_TIMEOUT / 2)
    reconciler.reconcile_once()
    assert [m.status for m in migrations_of(client, job_id)] == ["pending"]
    assert failures(client, job_id) == []

    age(client, job_id, MIGRATION_TIMEOUT)  # the backend gave up on its replacement
    reconciler.reconcile_once()
    assert [m.status for m in migrations_of(client, job_id)] == ["failed"]
    [failed] = failures(client, job_id)
    assert (failed["ordinal"], failed["pod"]) == (1, f"{job_id}-1")
    assert f"within {MIGRATION_TIMEOUT:.0f} s" in failed["message"]
    reconciler.reconcile_once()  # failed once, not again
    assert len(failures(client, job_id)) == 1
    # No longer pending: the pod may migrate again.
    again = client.post(f"/api/v1/jobs/{job_id}/pods/1/migrate", headers=AUTH)
    assert again.status_code == 202, again.text
