"""`python -m trainer` as the backends run it: real processes, real signals, real torchrun."""

import json
import signal
import sys
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from tests.api.scenarios import alive
from tests.conftest import Process, Processes
from tests.factories import make_poisoned_csv, make_poisoned_model, make_reviews_csv, poisoned_steps
from tests.support import wait_for
from trainer.checkpoint import MARKER, latest_checkpoint
from trainer.contract.process import ExitCode, failure_reason
from trainer.contract.spec import JobSpec

pytestmark = pytest.mark.slow


def trainer_args(inputs: Path, work: Path, *extra: str) -> list[str]:
    return ["--model", "tiny", "--dataset", "reviews.csv", "--inputs-dir", str(inputs),
            "--cache-dir", str(work / "cache"), "--checkpoint-dir", str(work / "checkpoints"),
            "--model-dir", str(work / "model"), "--metrics-file", str(work / "reports.jsonl"),
            "--batch-size", "8", "--learning-rate", "3e-3", *extra]


def finish(process, timeout: float = 180.0) -> int:
    return process.wait(timeout=timeout)


def weights(work: Path) -> dict[str, torch.Tensor]:
    return load_file(work / "model" / "model.safetensors")


def events(work: Path, kind: str = "event") -> list[dict]:
    lines = (work / "reports.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_sigkill_mid_epoch_then_rerun_equals_uninterrupted(inputs_dir: Path, tmp_path: Path,
                                                           processes: Processes) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    extra = ("--epochs", "4", "--checkpoint-every-steps", "10")
    baseline, victim = tmp_path / "baseline", tmp_path / "victim"
    process = processes.trainer(trainer_args(inputs_dir, baseline, *extra), tmp_path / "b.log")
    assert finish(process) == 0

    process = processes.trainer(trainer_args(inputs_dir, victim, *extra), tmp_path / "v1.log")
    wait_for(lambda: (victim / "checkpoints" / "step-20" / MARKER).exists(),
             process=process, timeout=120)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    assert not (victim / "model").exists()
    resumed_at = latest_checkpoint(victim / "checkpoints").step
    assert resumed_at < 128  # killed before the end (4 epochs x 32 steps)

    process = processes.trainer(trainer_args(inputs_dir, victim, *extra), tmp_path / "v2.log")
    assert finish(process) == 0
    resumed = [e for e in events(victim) if e["data"]["type"] == "resumed"]
    assert resumed[0]["data"]["step"] == resumed_at
    expected, actual = weights(baseline), weights(victim)
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor)


def test_sigterm_checkpoints_flushes_and_exits_0(inputs_dir: Path, tmp_path: Path,
                                                 processes: Processes) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    extra = ("--epochs", "20", "--checkpoint-every-steps", "1000")
    process = processes.trainer(trainer_args(inputs_dir, tmp_path, *extra), tmp_path / "1.log")
    reports = tmp_path / "reports.jsonl"
    wait_for(lambda: reports.exists() and '"kind":"metric"' in reports.read_text(),
             process=process, timeout=120)
    process.send_signal(signal.SIGTERM)
    assert finish(process) == 0
    last_step = events(tmp_path, "metric")[-1]["data"]["step"]
    assert latest_checkpoint(tmp_path / "checkpoints").step == last_step
    assert [e for e in events(tmp_path) if e["data"]["type"] == "sigterm"]
    assert not (tmp_path / "model").exists()


def test_bad_input_exits_2_with_a_clear_message(inputs_dir: Path, tmp_path: Path,
                                                processes: Processes) -> None:
    (inputs_dir / "bad.csv").write_text("text,label\n" + "".join(
        f"review {i},{['a', 'b', 'c'][i % 3]}\n" for i in range(30)))
    args = trainer_args(inputs_dir, tmp_path)
    args[args.index("reviews.csv")] = "bad.csv"
    process = processes.trainer(args, tmp_path / "bad.log")
    assert finish(process) == 2
    assert "exactly 2 classes, found 3" in (tmp_path / "bad.log").read_text()
    failed = [e for e in events(tmp_path) if e["data"]["type"] == "failed"]
    assert failed[0]["data"]["reason"] == "bad_input"


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_two_processes_under_torchrun_train_bitwise_what_one_trains_alone(
        inputs_dir: Path, tmp_path: Path, processes: Processes, finetune: str) -> None:
    """A fixed global batch (trainer.shards): two participants computing a shard each, and one
    computing both in turn, with dropout, end with the same weights to the bit (LoRA's
    adapters and head too)."""
    common = ("--epochs", "2", "--checkpoint-every-steps", "0", "--batch-size", "4",
              "--global-batch-size", "8", "--finetune", finetune)
    pair, single = tmp_path / "pair", tmp_path / "single"
    process = processes.start(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "trainer", *trainer_args(inputs_dir, pair, *common)], {"OMP_NUM_THREADS": "1"},
        tmp_path / "pair.log")
    assert finish(process) == 0, (tmp_path / "pair.log").read_text()[-3000:]
    alone = processes.trainer(trainer_args(inputs_dir, single, *common), tmp_path / "single.log",
                              env={"OMP_NUM_THREADS": "1"})
    assert finish(alone) == 0

    completed = [e for e in events(pair) if e["data"]["type"] == "completed"]
    assert sorted(e["pod"] for e in completed) == ["local-0", "local-1"]
    assert len({e["data"]["checksum"] for e in completed}) == 1  # identical replicas
    assert [e["data"]["primary"] for e in sorted(completed, key=lambda e: e["pod"])] == [
        True, False]
    metrics = [m["data"] for m in events(pair, "metric") if m["pod"] == "local-0"]
    assert {m["participants"] for m in metrics} == {2}
    expected, actual = weights(single), weights(pair)
    assert all(torch.equal(actual[name], tensor) for name, tensor in expected.items())
    # The reported loss is the step's, over every sample of it, on both ranks alike.
    single_losses = [m["data"]["loss"] for m in events(single, "metric")]
    for pod in ("local-0", "local-1"):
        assert [m["data"]["loss"] for m in events(pair, "metric") if m["pod"] == pod] == (
            single_losses)


def training_pair(inputs_dir: Path, tmp_path: Path, processes: Processes
                  ) -> tuple[Process, dict[str, psutil.Process]]:
    """Two workers under torchrun, a long job, once they report a step: torchrun's process,
    and its workers by RANK."""
    make_reviews_csv(inputs_dir / "reviews.csv", rows=400)
    args = trainer_args(inputs_dir, tmp_path, "--epochs", "20", "--checkpoint-every-steps",
                        "1000")
    process = processes.start(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "trainer", *args], {"OMP_NUM_THREADS": "1"}, tmp_path / "pair.log")
    reports = tmp_path / "reports.jsonl"
    wait_for(lambda: reports.exists() and '"kind":"metric"' in reports.read_text(),
             process=process, timeout=120)
    return process, {w.environ().get("RANK", ""): w
                     for w in psutil.Process(process.pid).children()}


def test_a_sigterm_in_a_static_group_leaves_the_stop_step_saved_by_every_participant(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """The next round may form before the primary's copy is complete (a restart-mode round
    needs one pod): each participant writes the state it stops at before it exits, so none
    resumes from an older checkpoint and redoes the steps since."""
    process, workers = training_pair(inputs_dir, tmp_path, processes)
    follower = workers["1"]
    follower.send_signal(signal.SIGTERM)  # the primary stops with it, after the same step
    finish(process)  # failed: the primary's worker is not done (ExitCode.PEER_STOPPED)
    assert f"exitcode  : {ExitCode.PEER_STOPPED.value}" in (tmp_path / "pair.log").read_text()
    last = {m["pod"]: m["data"]["step"] for m in events(tmp_path, "metric")}
    assert last["local-0"] == last["local-1"]
    saved = {(c["pod"], c["data"]["step"]) for c in events(tmp_path, "checkpoint")}
    assert saved == {("local-0", last["local-0"]), ("local-1", last["local-1"])}
    assert latest_checkpoint(tmp_path / "checkpoints").step == last["local-0"]


def test_a_sigterm_while_a_peer_hangs_in_a_collective_keeps_the_last_committed_step(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """A peer whose connections stay open (its node lost, or its process hung: here stopped)
    never fails the collective that waits on it. torchrun's agent SIGTERMs its worker when the
    job's membership changes and SIGKILLs it 30 s later: the worker gives the collective up
    within its grace (trainer.distributed.Group.stopping), keeps its last committed step in an
    emergency checkpoint, and exits, so the next round loses no step."""
    process, workers = training_pair(inputs_dir, tmp_path, processes)
    primary, follower = workers["0"], workers["1"]
    follower.suspend()  # SIGSTOP: alive, its connections open, in no collective any more
    try:
        primary.send_signal(signal.SIGTERM)
        # Within the 30 s torchrun's agent gives a worker between its SIGTERM and its SIGKILL.
        wait_for(lambda: not alive(primary.pid), timeout=30,
                 what="the primary to give its collective up and exit")
    finally:
        follower.kill()
    finish(process)
    log = (tmp_path / "pair.log").read_text()
    assert "CollectiveAbandoned" in log, log[-3000:]
    last = [m["data"]["step"] for m in events(tmp_path, "metric") if m["pod"] == "local-0"][-1]
    emergency = [c["data"] for c in events(tmp_path, "checkpoint")
                 if c["pod"] == "local-0" and c["data"]["emergency"]]
    assert [c["step"] for c in emergency] == [last]
    assert latest_checkpoint(tmp_path / "checkpoints").step == last


def test_a_nan_loss_fails_the_job_with_the_step_and_the_value(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    make_poisoned_model(inputs_dir / "poisoned")
    make_poisoned_csv(inputs_dir / "poisoned.csv")
    step = poisoned_steps(JobSpec(model="poisoned", dataset="poisoned.csv", batch_size=8),
                          inputs_dir, epochs=1)[0]
    # Unclipped: the gradients' norm is computed for the check alone.
    args = trainer_args(inputs_dir, tmp_path, "--model", "poisoned", "--dataset", "poisoned.csv",
                        "--epochs", "1", "--max-grad-norm", "0")
    process = processes.trainer(args, tmp_path / "trainer.log")
    assert finish(process) == ExitCode.BAD_INPUT  # no restart would compute another value
    failed = [e["data"] for e in events(tmp_path) if e["data"]["type"] == "failed"]
    message = (f"loss became nan at step {step}; the spec's nonfinite_loss \"skip\" would skip "
               "such steps")
    assert failed == [{"type": "failed", "reason": "non_finite_loss", "message": message}]
    # What the backends give as the job's reason: the trainer's last error line.
    assert failure_reason((tmp_path / "trainer.log").read_text().splitlines()) == message
    assert [m["data"]["step"] for m in events(tmp_path, "metric")] == list(range(1, step))
    assert not (tmp_path / "model").exists()
