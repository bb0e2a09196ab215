"""A job's own credential in Azure Blob (api.services.job_credentials), against a real Azurite:
its pods' SAS does everything the trainer does in its job's container and nothing in another's,
it is extended while the job runs and revoked when it ends, and a deleted job takes its
container with it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobServiceClient
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlmodel import Session
from upath import UPath

from api.app import create_app
from api.reconciler import Reconciler
from api.services import job_credentials
from api.services.events import EventLog
from api.settings import Settings
from tests.api.conftest import ADMIN_TOKEN, AUTH, create_job
from tests.api.fakes import FakeBackend
from tests.stores import Store
from tests.support import wait_for
from trainer.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from trainer.contract import artifact_store
from trainer.contract.artifact_store import location

VARIABLE = job_credentials.VARIABLE


@pytest.fixture
def azure(azure_server: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """Azurite, its account's connection string (with the key) in the API's environment."""
    for name, value in azure_server.env.items():
        monkeypatch.setenv(name, value)
    filesystem = type(location("az://container").fs)
    filesystem.clear_instance_cache()
    yield azure_server
    filesystem.clear_instance_cache()


@pytest.fixture
def settings(azure: Store, tmp_path: Path, inputs_dir: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN, inputs_dir=inputs_dir,
                    reconcile_interval=3600, artifacts_per_job=True,
                    artifacts_credential_lifetime=600, artifacts_url=azure.new_location("jobs"))


def as_pod(env: dict[str, str], url: str) -> UPath:
    """`url` seen through a pod's credential (adlfs with its connection string)."""
    return UPath(url, connection_string=env[VARIABLE], use_listings_cache=False)


def refused() -> pytest.RaisesContext[Exception]:
    """Azure's answer to a SAS outside its container (adlfs wraps a failed upload's)."""
    return pytest.raises((HttpResponseError, RuntimeError), match="failed to authenticate")


def service(azure: Store) -> BlobServiceClient:
    return BlobServiceClient.from_connection_string(azure.env[VARIABLE])


def expiry(azure: Store, container: str) -> datetime | None:
    with service(azure) as client:
        policies = client.get_container_client(container).get_container_access_policy()
    found = [p.access_policy.expiry for p in policies["signed_identifiers"]]
    return datetime.fromisoformat(found[0]) if found else None  # as Azure writes it


def test_a_jobs_pods_reach_their_container_alone(azure: Store, settings: Settings) -> None:
    mine = job_credentials.grant(settings, "job-0000aaaa")
    job_credentials.grant(settings, "job-0000bbbb")  # another job's container
    base = str(settings.artifacts_url)
    granted = expiry(azure, f"{base.removeprefix('az://')}-job-0000aaaa")
    assert granted is not None and 500 < (granted - datetime.now(UTC)).total_seconds() < 700
    assert "SharedAccessSignature=" in mine[VARIABLE] and "AccountKey" not in mine[VARIABLE]
    assert azure.secret not in mine[VARIABLE]
    save_checkpoint(location(f"{base}-job-0000bbbb/checkpoints"), 1, {"w": torch.ones(1)}, {},
                    {})  # the other job's, written with the API's key

    # Everything a trainer does, in its own container: write, move into place, list, read,
    # delete (retention).
    checkpoints = as_pod(mine, f"{base}-job-0000aaaa/checkpoints")
    for step in (1, 2, 3):
        save_checkpoint(checkpoints, step, {"w": torch.ones(2) * step}, {"step": step}, {},
                        keep=2)
    assert [info.step for info in list_checkpoints(checkpoints)] == [2, 3]
    assert load_checkpoint(checkpoints / "step-3")[1] == {"step": 3}

    # Nothing in another job's container, nor in the store's own.
    for url in (f"{base}-job-0000bbbb/checkpoints", f"{base}/anything"):
        with refused():
            list_checkpoints(as_pod(mine, url))
        with refused():
            (as_pod(mine, url) / "planted").write_bytes(b"x")
    with refused():
        artifact_store.remove(as_pod(mine, f"{base}-job-0000bbbb/checkpoints/step-1"),
                              first="COMPLETE")
    assert [i.step for i in list_checkpoints(location(f"{base}-job-0000bbbb/checkpoints"))] == [1]

    # Revoked when the job ends; a job that runs gets its expiry moved on.
    job_credentials.revoke(settings, "job-0000aaaa")
    with refused():
        list_checkpoints(checkpoints)
    assert expiry(azure, f"{base.removeprefix('az://')}-job-0000aaaa") is None


def test_a_launched_job_has_its_own_container_and_credential_until_deleted(
        azure: Store, settings: Settings) -> None:
    backend = FakeBackend()
    with TestClient(create_app(settings, backend)) as client:
        job = create_job(client)
        launch = backend.launches[0]
        container = f"{settings.artifacts_url}-{job['id']}"
        assert str(launch.checkpoint_dir) == f"{container}/checkpoints"
        assert str(launch.model_dir) == f"{container}/model"
        save_checkpoint(as_pod(launch.store_env, str(launch.checkpoint_dir)), 5,
                        {"w": torch.ones(1)}, {}, {"epoch": 1})
        listed = client.get(f"/api/v1/jobs/{job['id']}/checkpoints", headers=AUTH).json()
        assert [c["id"] for c in listed] == ["step-5"]

        # A job that runs has its credential extended, once after a start, then at half-life.
        name = container.removeprefix("az://")
        day = settings.model_copy(update={"artifacts_credential_lifetime": 86400})
        renewals = job_credentials.Renewals(day)
        with Session(client.app.state.engine) as session:
            renewals.keep(session)
        extended = expiry(azure, name)
        assert extended is not None and (extended - datetime.now(UTC)).total_seconds() > 86000

        assert client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 202
        Reconciler(client.app.state.engine, settings, backend, EventLog(lambda *_: None)
                   ).reconcile_once()  # another process's reconciler: it revokes all the same
        assert expiry(azure, name) is None
        with refused():
            list_checkpoints(as_pod(launch.store_env, str(launch.checkpoint_dir)))
        assert client.delete(f"/api/v1/jobs/{job['id']}?delete_artifacts=true",
                             headers=AUTH).status_code == 204

        def deleted() -> bool:
            with service(azure) as blobs:
                return not blobs.get_container_client(container.removeprefix("az://")).exists()

        wait_for(deleted, what="the job's container to be deleted", timeout=30)


@pytest.mark.parametrize(("url", "problem"), [
    (None, "Azure Blob"), ("s3://bucket", "S3 has no per-job credential"),
    ("az://jobs/prefix", "names a container alone"), ("az://" + "x" * 51, "container alone")])
def test_per_job_credentials_need_an_azure_container(url: str | None, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Settings(artifacts_url=url, artifacts_per_job=True)
