"""The initializer (trainer.initializer) against a real hub mirror (olah), and what pods read of
its work: resolve_model and load_hub find the staged copies."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.test_staging import make_imdb_like
from tests.hub.mirror import HubMirror
from trainer import initializer
from trainer.contract.staged import HUB_DIR, PARTIAL_DIR, STAGED_FILE, staged, staging_id
from trainer.data import load_hub
from trainer.model import resolve_model

MODEL = "acme/tiny-bert"


def run_initializer(mirror: HubMirror, inputs: Path, kind: str, repo_id: str,
                    progress: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": mirror.endpoint,
           "HF_HOME": str(inputs.parent / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    return subprocess.run([sys.executable, "-m", "trainer.initializer", kind, repo_id,
                           "--inputs", str(inputs), "--progress", str(progress)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_model_is_staged_whole_once_and_pods_resolve_its_hub_id_to_it(
        hub_mirror: HubMirror, tmp_path: Path, tiny_model_dir: Path) -> None:
    hub_mirror.add_model(MODEL, tiny_model_dir)
    inputs = tmp_path / "inputs"
    leftover = inputs / HUB_DIR / PARTIAL_DIR / staging_id("model", MODEL) / "half.bin"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"from a killed staging")
    progress = tmp_path / "progress.json"
    done = run_initializer(hub_mirror, inputs, "model", MODEL, progress)
    assert done.returncode == 0, done.stderr
    directory = staged(inputs, "model", MODEL)
    assert directory is not None and not leftover.exists()
    meta = json.loads((directory / STAGED_FILE).read_text())
    expected = sorted(p.name for p in tiny_model_dir.iterdir() if p.is_file())
    assert sorted(meta["files"]) == expected and len(meta["commit"]) == 40
    for name in expected:
        assert (directory / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    state = json.loads(progress.read_text())
    assert state["state"] == "succeeded" and state["bytes_done"] == state["bytes_total"] > 0
    assert resolve_model(MODEL, inputs) == str(directory)
    assert resolve_model("acme/other", inputs) == "acme/other"  # not staged: the hub id
    # Staged already: nothing is fetched again.
    fetched = len(hub_mirror.fetches())
    again = run_initializer(hub_mirror, inputs, "model", MODEL, progress)
    assert again.returncode == 0 and json.loads(progress.read_text())["already"] is True
    assert len(hub_mirror.fetches()) == fetched == len(expected)


def test_a_hub_dataset_alias_reads_its_staged_copy(hub_mirror: HubMirror,
                                                   tmp_path: Path) -> None:
    hub_mirror.add_dataset("stanfordnlp/imdb", make_imdb_like(tmp_path / "imdb", rows=60))
    inputs = tmp_path / "inputs"
    done = run_initializer(hub_mirror, inputs, "dataset", "stanfordnlp/imdb",
                           tmp_path / "progress.json")
    assert done.returncode == 0, done.stderr
    splits = load_hub("imdb", inputs, tmp_path / "cache")
    assert len(splits["train"]) == len(splits["test"]) == 60
    assert collections.Counter(splits["train"].labels.tolist()) == {0: 30, 1: 30}
    assert {fetch.file for fetch in hub_mirror.fetches()} == {
        "plain_text/train-00000-of-00001.parquet", "plain_text/test-00000-of-00001.parquet"}


def test_a_missing_repository_fails_with_the_reason_in_the_progress_file(
        hub_mirror: HubMirror, tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    failed = run_initializer(hub_mirror, tmp_path / "inputs", "model", "acme/absent", progress)
    assert failed.returncode == 1
    state = json.loads(progress.read_text())
    assert state["state"] == "failed" and "acme/absent" in state["error"]
    assert staged(tmp_path / "inputs", "model", "acme/absent") is None


@pytest.mark.parametrize(("files", "kept"), [
    (["config.json", "model.safetensors", "pytorch_model.bin", "onnx/model.onnx"],
     ["config.json", "model.safetensors"]),
    (["config.json", "pytorch_model.bin"], ["config.json", "pytorch_model.bin"]),
])
def test_a_model_with_safetensors_weights_is_staged_without_other_formats(
        files: list[str], kept: list[str]) -> None:
    assert initializer.wanted("model", files) == kept
    assert initializer.wanted("dataset", files) == files


def test_two_initializers_of_one_staging_fetch_it_once(hub_mirror: HubMirror, tmp_path: Path,
                                                       tiny_model_dir: Path) -> None:
    """One left running by a control plane that stopped, one its successor started."""
    hub_mirror.add_model(MODEL, tiny_model_dir)
    inputs = tmp_path / "inputs"
    env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": hub_mirror.endpoint,
           "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    both = [subprocess.Popen([sys.executable, "-m", "trainer.initializer", "model", MODEL,
                              "--inputs", str(inputs)], env=env, stderr=subprocess.PIPE)
            for _ in range(2)]
    assert [process.wait(timeout=120) for process in both] == [0, 0]
    for process in both:
        assert process.stderr is not None
        process.stderr.close()
    assert staged(inputs, "model", MODEL) is not None
    counts = collections.Counter(hub_mirror.fetches())
    assert counts and set(counts.values()) == {1}


def test_a_pod_reads_the_staged_splits_without_the_dataset(tmp_path: Path,
                                                           tiny_model_dir: Path) -> None:
    """What the initializer tokenized for a spec is all a pod reads of its data: with the
    dataset's file gone, a pod still prepares, with the same splits."""
    import torch

    from tests.factories import make_uploaded_dataset
    from trainer.config import JobSpec, Runtime, TrainConfig
    from trainer.contract.datasets import DATA_FILE, dataset_dir
    from trainer.contract.staged import read_staged, tokens_key
    from trainer.prepare import prepare

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "tiny").symlink_to(tiny_model_dir)
    spec = JobSpec(model="tiny", dataset=make_uploaded_dataset(inputs), max_eval_samples=50)
    key = tokens_key(spec, inputs)
    done = subprocess.run([sys.executable, "-m", "trainer.initializer", "tokens", key, "--spec",
                           spec.model_dump_json(), "--inputs", str(inputs)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    rows = read_staged(staged(inputs, "tokens", key) or Path())["rows"]
    (dataset_dir(inputs, spec.dataset) / DATA_FILE).unlink()
    runtime = Runtime(inputs_dir=inputs, cache_dir=tmp_path / "empty-cache",
                      checkpoint_dir=tmp_path / "ckpt")
    prepared = prepare(TrainConfig(spec, runtime), torch.device("cpu"))
    assert (len(prepared.train), len(prepared.validation), len(prepared.test)) == (
        rows["train"], rows["validation"], rows["test"])
    assert not (tmp_path / "empty-cache").exists()  # nothing tokenized, nothing cached


def test_a_pod_resolves_a_hub_model_at_the_revision_its_spec_names(tmp_path: Path) -> None:
    from trainer.contract.staged import staged_dir

    inputs = tmp_path / "inputs"
    for revision in ("main", "v2"):
        directory = staged_dir(inputs, "model", MODEL, revision)
        directory.mkdir(parents=True)
        (directory / "config.json").write_text("{}")
        (directory / STAGED_FILE).write_text("{}")
    assert resolve_model(MODEL, inputs, "v2") == str(staged_dir(inputs, "model", MODEL, "v2"))
    assert resolve_model(MODEL, inputs) == str(staged_dir(inputs, "model", MODEL, "main"))
    assert resolve_model(MODEL, inputs, "v3") == MODEL  # not staged: the hub id
