from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.api.fakes import FakeBackend
from tests.conftest import Processes
from tests.factories import make_reviews_csv, metric_data, record

if TYPE_CHECKING:
    from tests.api.control_plane import ControlPlane

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """Every test of the API's database runs on a real SQLite file (the default) and on a
    fresh database of a real PostgreSQL server."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("postgres").create_database()
    return url


@pytest.fixture
def settings(tmp_path: Path, inputs_dir: Path, database_url: str | None) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN, inputs_dir=inputs_dir,
                    reconcile_interval=3600, port=8123, database_url=database_url)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def client(settings: Settings, backend: FakeBackend) -> Iterator[TestClient]:
    """The app on a real database; the reconciler's timer is off (tests call it)."""
    with TestClient(create_app(settings, backend)) as test_client:
        yield test_client


def create_job(client: TestClient, **spec: object) -> dict:
    response = client.post("/api/v1/jobs", json=spec, headers=AUTH)
    assert response.status_code == 201, response.text
    return response.json()


def report(client: TestClient, backend: FakeBackend, job_id: str, records: list[dict],
           pod: int = 0, incarnation: str = "i1", token: str | None = None) -> dict:
    launch = next(launch for launch in backend.launches if launch.job_id == job_id)
    response = client.post(f"/api/v1/jobs/{job_id}/reports",
                           headers={"Authorization": f"Bearer {token or launch.report_token}"},
                           json={"pod": f"{job_id}-{pod}", "incarnation": incarnation,
                                 "records": records})
    assert response.status_code == 200, response.text
    return response.json()


def metric(seq: int, step: int, **data: object) -> dict:
    return record(seq, metric_data(step, **data))


@pytest.fixture
def control_plane(tmp_path: Path, inputs_dir: Path, processes: Processes,
                  ) -> Iterator[ControlPlane]:
    """`python -m api` on a free port with the local backend; its jobs are deleted at the end."""
    from tests.api.control_plane import ControlPlane  # it imports this module's tokens

    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    plane = ControlPlane(processes, tmp_path / "data", inputs_dir)
    plane.start()
    yield plane
    plane.close()


@pytest.fixture
def mode() -> str:
    """The fault-tolerance mode of the test's jobs on `plane`: live, unless the test
    parametrizes `mode`."""
    return "live"


@pytest.fixture
def plane(tmp_path: Path, inputs_dir: Path, processes: Processes, mode: str,
          ) -> Iterator[ControlPlane]:
    """The control plane; its pods report the sample ids of every committed step.

    Killed pods of live jobs come back after 6 s: a live pod rejoins within about 5 s of its
    start, and a kill that lands between a pod's quorum request and its group set-up stalls
    the survivors for the 5 s collective timeout, which could otherwise outlast the whole
    outage. A restart job has no quorum to stall: its pods come back after the product's
    default second."""
    from tests.api.control_plane import ControlPlane

    make_reviews_csv(inputs_dir / "reviews.csv", rows=2400)
    control = ControlPlane(processes, tmp_path / "data", inputs_dir,
                           env={"LOG_SAMPLE_IDS": "true", "MIGRATOR_RESTART_BUDGET": "10",
                                "MIGRATOR_RESTART_BACKOFF": "6" if mode == "live" else "1"})
    control.start()
    yield control
    control.close()
