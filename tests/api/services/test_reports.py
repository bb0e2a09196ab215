"""The report writer's group commit: a batch that fails in the database fails alone, on SQLite
and on PostgreSQL; the other batches of its group are stored, and the writer's views of jobs,
pods and seqs stay as the database has them."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.engine import Engine

from api.errors import InvalidSpec
from api.services.events import EventLog
from api.services.reports import ReportWriter
from tests.api.conftest import AUTH, create_job, metric
from tests.api.fakes import FakeBackend
from tests.factories import record
from trainer.contract.records import ReportBatch, Started

POISON = "a value this database refuses"


def refuse_in_database(engine: Engine, job_id: str) -> None:
    """A trigger refusing the events of `job_id` whose message is POISON, as a constraint
    refuses data that passed the API's validation: the failure is the database's own."""
    with engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            connection.exec_driver_sql(
                f"CREATE TRIGGER poison BEFORE INSERT ON event WHEN NEW.job_id = '{job_id}' "
                f"AND json_extract(NEW.data, '$.message') = '{POISON}' "
                "BEGIN SELECT RAISE(ABORT, 'poisoned batch'); END")
        else:
            connection.exec_driver_sql(
                "CREATE FUNCTION poison() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.job_id = '{job_id}' AND NEW.data->>'message' = '{POISON}' THEN "
                "RAISE EXCEPTION 'poisoned batch' USING ERRCODE = 'check_violation'; "
                "END IF; RETURN NEW; END $$ LANGUAGE plpgsql")
            connection.exec_driver_sql("CREATE TRIGGER poison BEFORE INSERT ON event "
                                       "FOR EACH ROW EXECUTE FUNCTION poison()")


def batch(job_id: str, records: list[dict]) -> ReportBatch:
    return ReportBatch.model_validate({"pod": f"{job_id}-0", "incarnation": "i1",
                                       "records": records})


def metric_steps(items: list[dict]) -> list[int]:
    return [item["data"]["step"] for item in items if item["type"] == "metric"]


def test_a_batch_the_database_refuses_fails_alone(client: TestClient,
                                                  backend: FakeBackend) -> None:
    poisoned_job, other_job = create_job(client)["id"], create_job(client)["id"]
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]
    refuse_in_database(engine, poisoned_job)
    published: list[tuple[str, list[dict]]] = []
    writer = ReportWriter(engine, EventLog(lambda job_id, items: published.append(
        (job_id, items))), quota=2**40)
    started = Started(message=POISON, step=0, epoch=1, samples={"train": 800})
    # Queued before the writer runs, so that they make one group, and one transaction.
    first = writer.submit(poisoned_job, batch(poisoned_job, [metric(1, 1), metric(2, 2)]))
    poisoned = writer.submit(poisoned_job, batch(poisoned_job, [metric(3, 50),
                                                                record(4, started)]))
    other = writer.submit(other_job, batch(other_job, [metric(1, 1), metric(2, 2)]))
    # The poisoned job's pod sends its records again, without the poison.
    resent = writer.submit(poisoned_job, batch(poisoned_job, [metric(3, 3), metric(4, 4),
                                                              metric(5, 5)]))
    commits: list[object] = []

    def count(connection: object) -> None:
        commits.append(connection)

    event.listen(engine, "commit", count)
    writer.start()
    try:
        first_items, _, _ = first.result(timeout=30)
        error = poisoned.exception(timeout=30)
        other_items, other_duplicates, finish = other.result(timeout=30)
        resent_items, resent_duplicates, _ = resent.result(timeout=30)
    finally:
        writer.stop()
        event.remove(engine, "commit", count)
    assert len(commits) == 1  # the four batches were one group

    assert isinstance(error, InvalidSpec), error  # a 422 for its sender: retrying won't help
    assert "the database refused this batch" in error.detail[0]["msg"]
    assert "poisoned batch" in error.detail[0]["msg"]
    assert metric_steps(first_items) == [1, 2]
    assert (metric_steps(other_items), other_duplicates, finish) == ([1, 2], 0, None)
    # The failed batch's seqs were not taken as stored, nor its step as the job's progress.
    assert (metric_steps(resent_items), resent_duplicates) == ([3, 4, 5], 0)
    assert {job_id for job_id, _ in published} == {poisoned_job, other_job}

    for job_id, step in ((poisoned_job, 5), (other_job, 2)):
        state = client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()
        assert (state["status"], state["progress"]["step"]) == ("running", step)
        assert state["progress"]["total_samples"] is None  # the refused Started is not applied
        assert state["pods"][0]["step"] == step
        events = client.get(f"/api/v1/jobs/{job_id}/events?type=metric", headers=AUTH).json()
        assert [e["data"]["step"] for e in events["data"]] == list(range(1, step + 1))
