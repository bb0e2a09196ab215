"""Hub models and datasets staged once before a job's pods start (api.services.preparation),
end to end: `python -m api` with the local backend, a real hub mirror (olah, offline, serving
local git repositories) at HF_ENDPOINT, real initializer and trainer processes."""

from __future__ import annotations

import collections
import csv
from pathlib import Path
from typing import Any

import pytest

from tests.api.control_plane import ControlPlane
from tests.api.scenarios import Job
from tests.conftest import Processes
from tests.factories import make_reviews_csv, tiny_spec
from tests.hub.mirror import HubMirror
from tests.support import free_port

pytestmark = pytest.mark.slow

MODEL = "acme/tiny-bert"


def make_imdb_like(folder: Path, rows: int = 240) -> Path:
    """A dataset repository shaped as stanfordnlp/imdb is: Parquet splits under plain_text/,
    integer labels, the hub's file names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split, seed in (("train", 0), ("test", 1)):
        reviews = make_reviews_csv(folder / f"{split}.csv", rows=rows, seed=seed)
        with reviews.open() as handle:
            read = list(csv.DictReader(handle))
        reviews.unlink()
        table = pa.table({"text": [r["text"] for r in read],
                          "label": [int(r["label"] == "positive") for r in read]})
        (folder / "plain_text").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / "plain_text" / f"{split}-00000-of-00001.parquet")
    return folder


def hub_plane(processes: Processes, tmp_path: Path, inputs_dir: Path, endpoint: str,
              ) -> ControlPlane:
    plane = ControlPlane(processes, tmp_path / "data", inputs_dir,
                         env={"HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
                              "HF_HOME": str(tmp_path / "hf-home")})
    plane.start()
    return plane


def stagings(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    return {row["repo_id"]: row for row in plane.http.get("/api/v1/stagings").json()["data"]}


def test_a_hub_model_and_dataset_are_staged_once_for_every_job_and_pod(
        hub_mirror: HubMirror, tmp_path: Path, inputs_dir: Path, processes: Processes,
        tiny_model_dir: Path) -> None:
    hub_mirror.add_model(MODEL, tiny_model_dir)
    # The seed recipe (preset seed: a quarter of IMDB's 50,000 reviews, split anew): here a
    # quarter of 6,000, long enough (300 steps) for the killed pod to rejoin (within 80).
    hub_mirror.add_dataset("stanfordnlp/imdb", make_imdb_like(tmp_path / "imdb", rows=3000))
    plane = hub_plane(processes, tmp_path, inputs_dir, hub_mirror.endpoint)
    try:
        spec = tiny_spec(model=MODEL, dataset="imdb", preset="seed", replicas=2, epochs=5,
                         max_eval_samples=100, fault_tolerance="live", checkpoint_every_steps=10)
        job = Job(plane, spec)
        assert plane.job(job.id)["status"] == "preparing"
        assert set(stagings(plane)) == {MODEL, "stanfordnlp/imdb"}
        plane.wait_status(job.id, "running", "failed")
        staged = stagings(plane)
        assert sorted(row["kind"] for row in staged.values()) == ["dataset", "model", "tokens"]
        assert {row["status"] for row in staged.values()} == {"succeeded"}
        assert all(row["bytes_done"] == row["bytes_total"] > 0 for row in staged.values())
        messages = [event["data"].get("message", "") for event in plane.events(job.id, "job")]
        assert any(m.startswith("preparing: staging") for m in messages)
        assert any(m.startswith("staged ") for m in messages)
        # A pod killed mid-epoch is recreated, with its hub client offline, and heals.
        job.wait_steps(3, 0.0, 2, (0, 1), "both pods to train")
        killed = job.kill(1)
        job.wait_steps(1, killed, 2, (1,), "the recreated pod to train with the other")
        finished = job.finish()
        assert job.reports("healed", killed) and finished["pods"][1]["restarts"] == 1
        first = hub_mirror.fetches()
        counts = collections.Counter((fetch.repo, fetch.file) for fetch in first)
        assert counts and set(counts.values()) == {1}, counts
        assert {file for _, file in counts} >= {"config.json", "model.safetensors",
                                                "plain_text/train-00000-of-00001.parquet"}
        # A second job on the same assets stages nothing and fetches nothing.
        again = plane.http.post("/api/v1/jobs", json={**spec, "epochs": 1})
        assert again.status_code == 201 and again.json()["status"] == "starting", again.text
        second = plane.wait_status(again.json()["id"], "succeeded", "failed")
        assert second["status"] == "succeeded", second["reason"]
        assert hub_mirror.fetches() == first
        # The splits were tokenized once, by the initializer: no pod tokenized them.
        assert list((plane.data_dir / "cache").rglob("*.npz")) == []
        assert len(list((inputs_dir / "hub" / "tokens").glob("*.npz"))) == 3
        download = plane.http.get(f"/api/v1/models/{finished['model_id']}/download")
        assert download.status_code == 200
    finally:
        plane.close()


def test_a_staging_that_cannot_reach_the_hub_fails_the_job_before_any_pod_starts(
        tmp_path: Path, inputs_dir: Path, processes: Processes) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    plane = hub_plane(processes, tmp_path, inputs_dir, closed)
    try:
        created = plane.http.post("/api/v1/jobs", json=tiny_spec(model=MODEL))
        assert created.status_code == 201, created.text
        job = plane.wait_status(created.json()["id"], "failed", timeout=120)
        assert job["reason"].startswith(f"staging model {MODEL}@main failed:"), job["reason"]
        assert not (plane.data_dir / "jobs" / job["id"]).exists()
        row = stagings(plane)[MODEL]
        assert row["status"] == "failed" and row["error"]
        # The next job that names it tries again (and fails again, here).
        retried = plane.http.post("/api/v1/jobs", json=tiny_spec(model=MODEL)).json()
        assert retried["status"] == "preparing"
        plane.wait_status(retried["id"], "failed", timeout=120)
        assert stagings(plane)[MODEL]["attempts"] == 2
    finally:
        plane.close()


def test_a_spec_the_staged_model_cannot_train_fails_at_preparing_and_is_refused_after(
        hub_mirror: HubMirror, tmp_path: Path, inputs_dir: Path, processes: Processes,
        tiny_model_dir: Path) -> None:
    """The tiny model has 2 layers: 3 pipeline stages cannot split it."""
    hub_mirror.add_model(MODEL, tiny_model_dir)
    plane = hub_plane(processes, tmp_path, inputs_dir, hub_mirror.endpoint)
    try:
        spec = tiny_spec(model=MODEL, parallelism="pipeline", pipeline_stages=3, replicas=1)
        created = plane.http.post("/api/v1/jobs", json=spec)
        assert created.status_code == 201 and created.json()["status"] == "preparing"
        job = plane.wait_status(created.json()["id"], "failed", timeout=120)
        assert job["reason"].startswith("pipeline_stages:"), job["reason"]
        refused = plane.http.post("/api/v1/jobs", json=spec)  # staged now: checked at once
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"] == ["body", "pipeline_stages"]
    finally:
        plane.close()
