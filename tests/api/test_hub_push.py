"""A succeeded job's model pushed to the hub where its spec asks (`export.hub_repo`), end to end:
`python -m api` with the local backend, real trainer and initializer processes, and a hub that
takes uploads (tests/hub/uploads.py) at HF_ENDPOINT, with the token in the control plane's
environment alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification

from tests.api.control_plane import ControlPlane
from tests.api.scenarios import Job
from tests.conftest import Processes
from tests.factories import tiny_spec
from tests.hub.uploads import UploadHub
from tests.support import wait_for

pytestmark = pytest.mark.slow


def pushes(plane: ControlPlane, job_id: str) -> list[dict[str, object]]:
    return [event["data"] for event in plane.events(job_id, "job")
            if event["data"].get("type") in ("pushed", "push_failed")]


def test_a_succeeded_jobs_model_is_pushed_and_a_failed_push_leaves_the_job_succeeded(
        upload_hub: UploadHub, tmp_path: Path, inputs_dir: Path, processes: Processes) -> None:
    plane = ControlPlane(processes, tmp_path / "data", inputs_dir, env={
        "HF_ENDPOINT": upload_hub.endpoint, "HF_TOKEN": upload_hub.token,
        "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": str(tmp_path / "hf-home")})
    plane.start()
    try:
        spec = tiny_spec(replicas=1, max_train_samples=64, max_eval_samples=32,
                         export={"hub_repo": "acme/reviews", "private": False})
        job = Job(plane, spec)
        assert plane.wait_status(job.id, "succeeded", "failed")["status"] == "succeeded"
        pushed = wait_pushed(plane, job.id)
        assert pushed["type"] == "pushed" and pushed["hub_repo"] == "acme/reviews", pushed
        repo = upload_hub.repo("acme/reviews")
        assert repo["private"] is False and [c["oid"] for c in repo["commits"]] == [
            pushed["commit"]]
        # The registry's model is what the hub holds, and it loads from there.
        registered = next(path.parent for path in plane.data_dir.rglob("model.safetensors")
                          if job.id in str(path))
        files = upload_hub.files("acme/reviews")
        for name in ("config.json", "model.safetensors", "README.md"):
            assert (files / name).read_bytes() == (registered / name).read_bytes()
        AutoModelForSequenceClassification.from_pretrained(files)
        listed = plane.http.get("/api/v1/stagings", params={"kind": "push"}).json()["data"]
        assert [(row["repo_id"], row["revision"], row["status"]) for row in listed] == [
            ("acme/reviews", job.id, "succeeded")]

        # The hub unreachable: the push fails, says why, and the job stays succeeded.
        upload_hub.stop()
        second = Job(plane, {**spec, "export": {"hub_repo": "acme/reviews"}})
        assert plane.wait_status(second.id, "succeeded", "failed")["status"] == "succeeded"
        failed = wait_pushed(plane, second.id)
        assert failed["type"] == "push_failed" and "stays in the registry" in str(
            failed["message"])
        assert plane.job(second.id)["status"] == "succeeded"
        assert plane.http.get(f"/api/v1/models/{plane.job(second.id)['model_id']}"
                              ).status_code == 200
        events = json.dumps([plane.events(j, "job") for j in (job.id, second.id)])
        assert upload_hub.token not in events  # the token is in no event
    finally:
        plane.close()


def wait_pushed(plane: ControlPlane, job_id: str) -> dict[str, object]:
    return wait_for(lambda: (found := pushes(plane, job_id)) and found[0], timeout=120,
                    what=f"job {job_id}'s push to end")
