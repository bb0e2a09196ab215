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
