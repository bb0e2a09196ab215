"""A succeeded job's model pushed to the hub (trainer.hub_push, the initializer's `push` kind)
against a hub that takes uploads (tests/hub/uploads.py): the files byte for byte in one commit,
weights through LFS, links never followed, pushed once, and a refused token said plainly."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from transformers import AutoModelForSequenceClassification

from tests.hub.uploads import UploadHub
from trainer.contract.staged import STAGED_FILE, staged

REPO = "acme/sentiment"


def exported_model(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A job's export as the trainer leaves it: the model, a README, a LoRA adapter folder,
    and a link a pod could have put there, to a file outside."""
    model = tmp_path / "models" / "job-1" / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "README.md").write_text("---\nlibrary_name: transformers\n---\n# Sentiment\n")
    (model / "adapter").mkdir()
    (model / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the hub")
    (model / "leak.txt").symlink_to(secret)
    return model


def run_push(hub: UploadHub, inputs: Path, model: Path, progress: Path, token: str,
             job: str = "job-1", private: bool = True) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": token,
           "HF_HOME": str(inputs.parent / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_XET": "1"}  # the test hub speaks LFS, not Xet
    spec = json.dumps({"model_dir": str(model), "private": private, "message": f"{job} done"})
    return subprocess.run([sys.executable, "-m", "trainer.initializer", "push", REPO,
                           "--revision", job, "--inputs", str(inputs), "--spec", spec,
                           "--progress", str(progress)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_model_is_pushed_whole_in_one_commit_once_and_loads_from_the_hub(
        upload_hub: UploadHub, tmp_path: Path, tiny_model_dir: Path) -> None:
    model, inputs = exported_model(tmp_path, tiny_model_dir), tmp_path / "inputs"
    progress = tmp_path / "progress.json"
    done = run_push(upload_hub, inputs, model, progress, upload_hub.token)
    assert done.returncode == 0, done.stderr[-3000:]
    repo = upload_hub.repo(REPO)
    assert repo["private"] is True and len(repo["commits"]) == 1
    pushed = upload_hub.files(REPO)
    expected = sorted(str(p.relative_to(model)) for p in model.rglob("*")
                      if p.is_file() and not p.is_symlink())
    assert repo["commits"][0]["files"] == expected and repo["commits"][0]["summary"] == "job-1 done"
    for name in expected:
        assert (pushed / name).read_bytes() == (model / name).read_bytes()
    assert not (pushed / "leak.txt").exists()  # the link was not followed
    # The weights went through Git LFS (batch, upload, verify); the small files inline.
    paths = [r["path"] for r in upload_hub.requests()]
    assert f"/{REPO}.git/info/lfs/objects/batch" in paths
    assert f"/{REPO}.git/info/lfs/objects/verify" in paths
    loaded = AutoModelForSequenceClassification.from_pretrained(pushed)
    assert loaded.config.num_labels == AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir).config.num_labels
    directory = staged(inputs, "push", REPO, "job-1")
    assert directory is not None
    meta = json.loads((directory / STAGED_FILE).read_text())
    assert meta["commit"] == repo["commits"][0]["oid"] and meta["files"] == expected
    state = json.loads(progress.read_text())
    assert state["state"] == "succeeded" and state["bytes_done"] == state["bytes_total"] > 0
    # Pushed once: the same job's push again commits nothing; another job's is a new commit.
    asked = len(upload_hub.requests())
    again = run_push(upload_hub, inputs, model, progress, upload_hub.token)
    assert again.returncode == 0 and json.loads(progress.read_text())["already"] is True
    assert len(upload_hub.requests()) == asked
    other = run_push(upload_hub, inputs, model, progress, upload_hub.token, job="job-2")
    assert other.returncode == 0, other.stderr[-3000:]
    assert len(upload_hub.repo(REPO)["commits"]) == 2


def test_a_refused_token_fails_the_push_with_the_hubs_reason_and_nothing_is_recorded(
        upload_hub: UploadHub, tmp_path: Path, tiny_model_dir: Path) -> None:
    model, inputs = exported_model(tmp_path, tiny_model_dir), tmp_path / "inputs"
    progress = tmp_path / "progress.json"
    refused = run_push(upload_hub, inputs, model, progress, "hf_wrong")
    assert refused.returncode == 1
    state = json.loads(progress.read_text())
    assert state["state"] == "failed" and "401" in state["error"]
    assert "hf_wrong" not in state["error"]
    assert staged(inputs, "push", REPO, "job-1") is None
    assert not upload_hub.files(REPO).exists()
    assert {r["authorized"] for r in upload_hub.requests()} == {False}
