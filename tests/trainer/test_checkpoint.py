import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from upath import UPath

from trainer import checkpoint
from trainer.checkpoint import (
    MARKER,
    CheckpointInfo,
    CheckpointWriter,
    apply_retention,
    cpu_copy,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


def save(directory: Path, step: int, val_accuracy: float | None = None, keep: int = 10) -> None:
    save_checkpoint(directory, step, {"w": torch.full((2,), float(step))}, {"step": step},
                    {"metrics": {"val_accuracy": val_accuracy}}, keep=keep)


def test_round_trip_holds_model_and_trainer_state(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    info = save_checkpoint(tmp_path, 7, model.state_dict(),
                           {"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()},
                           {"epoch": 2, "cursor": 48})
    model_state, trainer_state, meta = load_checkpoint(info.path)
    restored = nn.Linear(3, 2)
    restored.load_state_dict(model_state)
    assert torch.equal(restored.weight, model.weight)
    fresh = torch.optim.AdamW(restored.parameters())
    fresh.load_state_dict(trainer_state["optimizer"])
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"],
                       optimizer.state_dict()["state"][0]["exp_avg"])
    assert (meta["step"], meta["epoch"], meta["cursor"]) == (7, 2, 48)


def test_module_prefix_is_stripped(tmp_path: Path) -> None:
    wrapped = nn.Sequential()
    wrapped.module = nn.Linear(2, 2)  # the shape of DDP's state dict: "module.weight"
    assert "module.weight" in wrapped.state_dict()
    info = save_checkpoint(tmp_path, 1, wrapped.state_dict(), {}, {})
    assert set(load_checkpoint(info.path)[0]) == {"weight", "bias"}


def test_latest_is_the_highest_complete_step_not_the_newest_file(tmp_path: Path) -> None:
    for step in (5, 40, 10):
        save(tmp_path, step)
    os.utime(tmp_path / "step-5", (time.time() + 100, time.time() + 100))
    assert latest_checkpoint(tmp_path).step == 40


def test_incomplete_checkpoints_are_ignored_and_cleaned(tmp_path: Path) -> None:
    save(tmp_path, 10)
    save(tmp_path, 20)
    (tmp_path / "step-20" / MARKER).unlink()  # killed between rename and marker
    (tmp_path / "step-30.tmp").mkdir()  # killed while writing
    assert latest_checkpoint(tmp_path).step == 10
    save(tmp_path, 30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-30"]
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        (tmp_path / "step-30" / MARKER).unlink()
        load_checkpoint(tmp_path / "step-30")


def test_retention_keeps_last_k_plus_the_best(tmp_path: Path) -> None:
    accuracies = {10: 0.70, 20: 0.91, 30: 0.80, 40: None, 50: 0.85, 60: None}
    for step, accuracy in accuracies.items():
        save(tmp_path, step, accuracy, keep=2)
    assert [info.step for info in list_checkpoints(tmp_path)] == [20, 50, 60]
    assert apply_retention(tmp_path, keep=1) == [tmp_path / "step-50"]


WRITER = """
import sys, torch
from pathlib import Path
from trainer.checkpoint import save_checkpoint
directory = Path(sys.argv[1])
save_checkpoint(directory, 1, {"w": torch.zeros(4)}, {}, {})
print("first saved", flush=True)
save_checkpoint(directory, 2, {"w": torch.randn(64, 1024, 1024)}, {}, {})
"""


def test_checkpoint_killed_halfway_is_never_resumed_from(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)],
                               stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"first saved\n"
        deadline = time.monotonic() + 60
        staging = tmp_path / "step-2.tmp"
        while not staging.exists():
            assert time.monotonic() < deadline, "the second checkpoint never started"
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    assert not (tmp_path / "step-2" / MARKER).exists()
    assert latest_checkpoint(tmp_path).step == 1
    model_state, _, _ = load_checkpoint(latest_checkpoint(tmp_path).path)
    assert torch.equal(model_state["w"], torch.zeros(4))


def test_background_writer_snapshots_and_reports_errors(tmp_path: Path) -> None:
    weights = {"w": torch.zeros(3)}
    snapshot = cpu_copy({"model": weights, "groups": [{"lr": 0.1}]})
    weights["w"] += 1  # a later training step changes the live tensors in place
    assert snapshot["model"]["w"].tolist() == [0.0, 0.0, 0.0]

    writer, started, release, done = CheckpointWriter(), threading.Event(), threading.Event(), []

    def slow_write() -> CheckpointInfo:
        started.set()
        assert release.wait(10)
        return save_checkpoint(tmp_path, 1, snapshot["model"], {}, {})

    writer.submit(slow_write, done.append)
    assert started.wait(10) and not done  # submit returned while the write is in flight
    release.set()
    writer.wait()
    assert [info.step for info in done] == [1] and latest_checkpoint(tmp_path).step == 1

    def failing_write() -> CheckpointInfo:
        raise OSError("disk full")

    writer.submit(failing_write, done.append)
    with pytest.raises(OSError, match="disk full"):
        writer.wait()
    writer.wait()  # reported once


def test_survivors_writing_the_same_emergency_step_agree(tmp_path: Path) -> None:
    def write(value: float) -> None:
        save_checkpoint(tmp_path, 5, {"w": torch.full((2,), value)}, {}, {}, shared=True)

    writers = [threading.Thread(target=write, args=(1.0,)) for _ in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    assert [info.step for info in list_checkpoints(tmp_path)] == [5]
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert load_checkpoint(tmp_path / "step-5")[0]["w"].tolist() == [1.0, 1.0]


class Killed(Exception):
    """Stands for a process killed at that point of a write."""


def check_supersede(directory: Path | UPath, monkeypatch: pytest.MonkeyPatch) -> None:
    """An epoch-end checkpoint supersedes an emergency one of its step, which another
    emergency save keeps; cut short anywhere, a supersede leaves a whole checkpoint of the
    step, the newer once its marker is written, and the next save clears what is left over.
    (Run on a directory and on each object store: there moves are copies.)"""
    def names() -> list[str]:
        return sorted(path.name for path in directory.iterdir())

    def save(step: int, epoch_end: bool, shared: bool = False) -> CheckpointInfo:
        return save_checkpoint(directory, step, {"w": torch.full((2,), float(step))},
                               {"epoch_end_pending": not epoch_end},
                               {"epoch_end": epoch_end, "emergency": shared,
                                "metrics": {"val_accuracy": 0.5 if epoch_end else None}},
                               keep=10, shared=shared)

    def pending(info: CheckpointInfo) -> bool:
        return load_checkpoint(info.path)[1]["epoch_end_pending"]

    emergency = save(4, epoch_end=False, shared=True)
    assert save(4, epoch_end=False, shared=True) == emergency  # the step is saved already
    done = save(4, epoch_end=True)
    assert (done.path.name, done.revision, names()) == ("step-4.r1", 1, ["step-4.r1"])
    assert save(4, epoch_end=False, shared=True) == done
    [listed] = list_checkpoints(directory)
    assert listed.path == done.path and listed.meta["epoch_end"] and not pending(listed)

    emergency = save(8, epoch_end=False, shared=True)
    write_durable = checkpoint.write_durable

    def killed_before_the_marker(path, write):  # type: ignore[no-untyped-def]
        if path.name == MARKER and path.parent.name == "step-8.r1":
            raise Killed
        write_durable(path, write)

    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(checkpoint, "write_durable", killed_before_the_marker)
        save(8, epoch_end=True)
    assert latest_checkpoint(directory) == emergency and pending(emergency)
    assert "step-8.r1" in names()  # whole but unmarked: nobody's to read

    def killed_before_the_deletion(path: Path | UPath) -> None:
        raise Killed

    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(checkpoint, "remove_checkpoint", killed_before_the_deletion)
        save(8, epoch_end=True)
    assert "step-8" in names() and (directory / "step-8" / MARKER).exists()
    newest = latest_checkpoint(directory)
    assert newest is not None and newest.path.name == "step-8.r1" and not pending(newest)
    assert [info.path.name for info in list_checkpoints(directory)] == ["step-4.r1", "step-8.r1"]
    save(9, epoch_end=False)
    assert names() == ["step-4.r1", "step-8.r1", "step-9"]


def test_an_epoch_end_supersedes_an_emergency_checkpoint_of_its_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_supersede(tmp_path, monkeypatch)
