"""Links a pod plants in its job's directory lead nowhere (trainer.contract.artifact_store): not
into another job's checkpoints, not to a file elsewhere. Nothing lists, reads, sizes or copies
through them, and deleting deletes the link, never what it points to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.checkpoint import save_checkpoint
from trainer.contract import artifact_store
from trainer.contract.checkpoints import (
    MARKER,
    META_FILE,
    apply_retention,
    list_checkpoints,
    remove_checkpoint,
)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "secret"
    path.parent.mkdir()
    path.write_text("the admin token, say")
    return path


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Another job's checkpoint directory, with one complete checkpoint."""
    directory = tmp_path / "jobs" / "job-victim" / "checkpoints"
    save_checkpoint(directory, 5, {"w": torch.ones(2)}, {"step": 5},
                    {"epoch": 1, "metrics": {"val_accuracy": 0.9}})
    return directory


def whole(checkpoint: Path) -> list[str]:
    return sorted(path.name for path in checkpoint.iterdir())


def test_a_linked_checkpoint_is_not_one(tmp_path: Path, victim: Path, secret: Path) -> None:
    mine = tmp_path / "jobs" / "job-mine" / "checkpoints"
    save_checkpoint(mine, 1, {"w": torch.zeros(2)}, {"step": 1}, {"epoch": 1})
    (mine / "step-7").symlink_to(victim / "step-5", target_is_directory=True)
    # A real directory whose marker or metadata is a link is no checkpoint either.
    (mine / "step-8").mkdir()
    (mine / "step-8" / MARKER).symlink_to(victim / "step-5" / MARKER)
    (mine / "step-8" / META_FILE).write_text("{}")
    (mine / "step-9").mkdir()
    (mine / "step-9" / MARKER).write_text("ok\n")
    (mine / "step-9" / META_FILE).symlink_to(victim / "step-5" / META_FILE)

    assert [info.step for info in list_checkpoints(mine)] == [1]
    assert artifact_store.entries(mine / "step-7") == []
    assert not artifact_store.has_file(mine / "step-7", MARKER)
    with pytest.raises(OSError):
        artifact_store.read_file(mine / "step-9", META_FILE)

    # Retention and deletion take the links, never the other job's checkpoint.
    remove_checkpoint(mine / "step-7")
    assert not (mine / "step-7").exists() and not (mine / "step-7").is_symlink()
    remove_checkpoint(mine / "step-8")
    assert whole(victim / "step-5") == [MARKER, META_FILE, "model.pt", "trainer.pt"]
    assert [info.step for info in list_checkpoints(victim)] == [5]
    assert secret.read_text() == "the admin token, say"


def test_links_inside_a_checkpoint_are_not_followed(tmp_path: Path, victim: Path,
                                                    secret: Path) -> None:
    mine = tmp_path / "jobs" / "job-mine" / "checkpoints"
    info = save_checkpoint(mine, 3, {"w": torch.zeros(2)}, {"step": 3}, {"epoch": 1})
    own = artifact_store.size(info.path)
    (info.path / "extra.pt").symlink_to(secret)
    (info.path / "theirs").symlink_to(victim, target_is_directory=True)
    (info.path / "nested").mkdir()
    (info.path / "nested" / "deeper").symlink_to(secret)

    assert artifact_store.links(info.path) == ["extra.pt", "nested/deeper", "theirs"]
    assert [relative for relative, _ in artifact_store.files(info.path)] == [
        MARKER, META_FILE, "model.pt", "trainer.pt"]
    assert artifact_store.size(info.path) == own
    with pytest.raises(OSError):
        artifact_store.open_file(info.path / "extra.pt")

    save_checkpoint(mine, 4, {"w": torch.zeros(2)}, {"step": 4}, {"epoch": 1})
    assert apply_retention(mine, keep=1) == [info.path]
    assert not info.path.exists()
    assert secret.read_text() == "the admin token, say"
    assert [i.step for i in list_checkpoints(victim)] == [5]
    assert whole(victim / "step-5") == [MARKER, META_FILE, "model.pt", "trainer.pt"]


def test_a_linked_directory_lists_nothing_and_is_removed_as_a_link(tmp_path: Path,
                                                                   victim: Path) -> None:
    link = tmp_path / "jobs" / "job-mine" / "checkpoints"
    link.parent.mkdir(parents=True)
    link.symlink_to(victim, target_is_directory=True)
    assert artifact_store.entries(link) == [] and list_checkpoints(link) == []
    assert artifact_store.links(link) == ["."] and list(artifact_store.files(link)) == []
    assert artifact_store.size(link) == 0
    artifact_store.remove(link, first=MARKER)
    assert not link.is_symlink()
    assert [i.step for i in list_checkpoints(victim)] == [5]
