"""Checkpoints and exports in an object store (trainer.contract.artifact_store), on each store:
Azure Blob (a real Azurite server, the real adlfs client) and S3 (moto's real S3 server, obstore's
client)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from obstore.fsspec import FsspecStore
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from upath import UPath

from tests.conftest import ROOT, Processes, outputs
from tests.stores import Store
from tests.support import wait_for
from tests.trainer.test_checkpoint import check_supersede
from trainer.checkpoint import (
    MARKER,
    apply_retention,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from trainer.contract import artifact_store
from trainer.contract.artifact_store import StoreError, location
from trainer.export import export_model
from trainer.recovery import LiveRecovery


@pytest.fixture
def blob(object_store: Store) -> UPath:
    """A prefix in a fresh container or bucket, the store's credentials in the environment."""
    root = location(object_store.new_location("checkpoints") + "/jobs/job-1")
    assert isinstance(root, UPath)
    return root


def names(directory: UPath) -> list[str]:
    return sorted(path.name for path in directory.iterdir()) if directory.exists() else []


def test_a_location_is_a_directory_or_a_store_url_without_credentials() -> None:
    assert location("runs/ckpt") == Path("runs/ckpt")
    assert location("file:///data/jobs") == Path("/data/jobs")
    blob = location("az://container/a/b/")
    assert isinstance(blob, UPath) and str(blob) == "az://container/a/b"
    s3 = location("s3://bucket/a")
    assert isinstance(s3, UPath) and str(s3) == "s3://bucket/a"
    assert isinstance(s3.fs, FsspecStore)  # obstore's S3 client, not s3fs
    for url, problem in [("gs://bucket/x", "unsupported artifacts URL"),
                         ("az://user:secret@container/x", "carries no credentials"),
                         ("az://container/x?sig=abc", "carries no credentials"),
                         ("s3://key:secret@bucket/x", "carries no credentials"),
                         ("az:///x", "names no bucket or container"),
                         ("s3:///x", "names no bucket or container")]:
        with pytest.raises(StoreError, match=problem):
            location(url)


def test_a_checkpoint_round_trips_through_the_store_marker_last(blob: UPath) -> None:
    directory = blob / "checkpoints"
    state = {"w": torch.arange(6.0).reshape(2, 3)}
    info = save_checkpoint(directory, 4, {"module.w": state["w"]}, {"step": 4},
                           {"epoch": 1, "metrics": {"val_accuracy": 0.5}})
    assert str(info.path) == f"{directory}/step-4" and names(directory) == ["step-4"]
    assert names(info.path) == ["COMPLETE", "meta.json", "model.pt", "trainer.pt"]
    model_state, trainer_state, meta = load_checkpoint(info.path)
    assert torch.equal(model_state["w"], state["w"]) and trainer_state == {"step": 4}
    assert (meta["step"], meta["epoch"]) == (4, 1)

    # Without its marker a checkpoint is nobody's to read, and the next save clears it.
    save_checkpoint(directory, 8, state, {"step": 8}, {"metrics": {"val_accuracy": 0.9}})
    (directory / "step-8" / MARKER).unlink()
    assert [i.step for i in list_checkpoints(directory)] == [4]
    assert latest_checkpoint(directory) is not None and latest_checkpoint(directory).step == 4
    save_checkpoint(directory, 12, state, {"step": 12}, {"metrics": {"val_accuracy": 0.1}},
                    keep=1)
    # Retention: the newest and the best (step 4's 0.5 beats step 12's 0.1); step-8 cleared.
    assert names(directory) == ["step-12", "step-4"]
    assert apply_retention(directory, keep=1) == []


def test_an_epoch_end_supersedes_an_emergency_checkpoint_beside_it(
        blob: UPath, monkeypatch: pytest.MonkeyPatch) -> None:
    check_supersede(blob / "checkpoints", monkeypatch)


WRITER = """
import sys, torch
from trainer.checkpoint import save_checkpoint
from trainer.contract.artifact_store import location
directory = location(sys.argv[1])
# The small model file is uploaded first: once it shows, the 256 MiB trainer file is still
# on its way (seconds), and the kill lands before the move that follows it.
big = {"w": torch.randn(64, 1024, 1024)}
save_checkpoint(directory, int(sys.argv[2]), {"w": torch.ones(2)}, big, {})
"""


def test_a_killed_upload_is_never_resumed_from_and_its_leftovers_are_cleaned(
        blob: UPath, tmp_path: Path) -> None:
    directory = blob / "checkpoints"
    save_checkpoint(directory, 3, {"w": torch.ones(2)}, {"step": 3}, {})
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(directory), "6"],
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        # Killed once the upload is under way: its staging prefix exists, its marker never.
        wait_for(lambda: "step-6.tmp" in names(directory), what="the upload to start",
                 timeout=120, interval=0.02, process=writer)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert "step-6.tmp" in names(directory) and "step-6" not in names(directory)
    newest = latest_checkpoint(directory)
    assert newest is not None and newest.step == 3
    assert torch.equal(load_checkpoint(newest.path)[0]["w"], torch.ones(2))
    save_checkpoint(directory, 9, {"w": torch.zeros(2)}, {"step": 9}, {})
    assert names(directory) == ["step-3", "step-9"]


def test_the_export_is_uploaded_whole_and_loads(blob: UPath, tiny_model_dir: Path,
                                                tmp_path: Path) -> None:
    from trainer.contract.spec import JobSpec

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    target = blob / "model"
    spec = JobSpec(model="tiny", dataset="reviews.csv")
    (blob / "model.tmp-killed0000" / "model.safetensors").write_bytes(b"half an upload")
    assert export_model(model, tokenizer, target, spec, {"test": {"accuracy": 0.75}},
                        {"train": 10}) == target
    assert names(blob) == ["model"]  # neither its staging prefix nor a killed export's left
    assert {"config.json", "metrics.json", "README.md", "model.safetensors"} <= set(names(target))
    # A live peer that comes second finds it exported and leaves it as it is, and leaves
    # alone what other peers may be staging.
    assert not LiveRecovery(blob / "checkpoints", target).exports(is_primary=False)
    (blob / "model.tmp-peer00000000" / "config.json").write_bytes(b"{}")
    export_model(model, tokenizer, target, spec, {}, {}, shared=True)
    assert names(blob) == ["model", "model.tmp-peer00000000"]
    assert "0.75" in (target / "metrics.json").read_text()
    artifact_store.remove(blob / "model.tmp-peer00000000")

    artifact_store.download(target, tmp_path / "copy")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "copy")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values(), strict=True))
    copied = (p for p in (tmp_path / "copy").rglob("*") if p.is_file())
    assert artifact_store.size(target) == sum(p.stat().st_size for p in copied)
    artifact_store.remove(target, first="config.json")
    assert names(blob) == []


def test_a_local_export_clears_a_killed_exports_staging(tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    from trainer.contract.spec import JobSpec

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    killed = tmp_path / "model.tmp-killed0000"
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half a file")
    (tmp_path / "model2.tmp-0").mkdir()  # another target's staging: left alone
    export_model(model, tokenizer, tmp_path / "model", JobSpec(model="tiny",
                 dataset="reviews.csv"), {}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model2.tmp-0"]


def test_entries_are_the_direct_children_and_none_where_nothing_was_written(blob: UPath,
                                                                           tmp_path: Path,
                                                                           ) -> None:
    for root in (blob, tmp_path / "local"):
        assert artifact_store.entries(root / "missing") == []
        (root / "a" / "b").mkdir(parents=True, exist_ok=True)  # a no-op in an object store
        (root / "a" / "b" / "file").write_bytes(b"1")
        (root / "a" / "top").write_bytes(b"2")
        assert sorted(path.name for path in artifact_store.entries(root / "a")) == ["b", "top"]
        assert [path.name for path in artifact_store.entries(root)] == ["a"]
        inner = next(path for path in artifact_store.entries(root / "a") if path.name == "b")
        assert (inner / "file").read_bytes() == b"1"  # the entries are paths to go on with


RANK_EXPORT = """
import sys
from pathlib import Path
import torch.distributed as dist
from transformers import AutoTokenizer
from trainer.config import JobSpec
from trainer.export import export_model
from trainer.model import load_model
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    export_model(load_model(sys.argv[1], seed=1), AutoTokenizer.from_pretrained(sys.argv[1]),
                 Path(sys.argv[2]), JobSpec(model="tiny", dataset="reviews.csv"), {}, {})
dist.barrier()
"""


def test_a_pod_that_is_not_global_rank_0_exports_the_whole_model(
        tiny_model_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """A pipeline's primary after a restart's rendezvous: transformers alone would write its
    tokenizer and card but neither config nor weights there (seen in CI)."""
    outputs(processes.world([sys.executable, "-c", RANK_EXPORT, str(tiny_model_dir),
                             str(tmp_path / "model")],
                            [tmp_path / f"rank-{rank}.log" for rank in range(2)]), timeout=120)
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "model").iterdir()}
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")
    assert loaded.config.num_labels == 2
