import json
import math
import shutil
import time
from pathlib import Path

import pytest
import torch

from tests.factories import (
    make_poisoned_csv,
    make_poisoned_model,
    make_uploaded_dataset,
    poisoned_steps,
)
from trainer.checkpoint import list_checkpoints
from trainer.config import TrainConfig
from trainer.distributed import Group
from trainer.model import choose_device
from trainer.recovery import Recovery
from trainer.report import JsonlSink, Reporter
from trainer.state import weights_checksum
from trainer.train import Trainer


def run(config: TrainConfig, reports: Path) -> Trainer:
    reporter = Reporter("test-0", "i", [JsonlSink(reports, "test-0", "i")])
    trainer = Trainer(config, Group(choose_device(), environ={}), reporter)
    trainer.train()
    reporter.close()
    return trainer


def records(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def drop_checkpoints_after(directory: Path, step: int) -> None:
    for info in list_checkpoints(directory):
        if info.step > step:
            shutil.rmtree(info.path)


def test_training_learns_reports_and_exports_a_loadable_model(make_config, tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, pipeline

    config = make_config(epochs=3)
    trainer = run(config, tmp_path / "reports.jsonl")
    assert trainer.metrics["test"]["accuracy"] >= 0.9
    metrics = records(tmp_path / "reports.jsonl", "metric")
    assert [m["data"]["step"] for m in metrics] == list(range(1, trainer.step + 1))
    assert metrics[-1]["data"]["samples_seen"] == 3 * trainer.data_sizes["train"]
    assert all(m["data"]["samples_per_second"] > 0 for m in metrics)
    evals = records(tmp_path / "reports.jsonl", "eval")
    assert [e["data"]["split"] for e in evals] == ["validation"] * 3 + ["test"]
    completed = [e for e in records(tmp_path / "reports.jsonl", "event")
                 if e["data"]["type"] == "completed"]
    assert completed[0]["data"]["model_dir"] == str(config.runtime.model_dir)

    model_dir = config.runtime.model_dir
    loaded = AutoModelForSequenceClassification.from_pretrained(model_dir)
    assert not any(key.startswith("module.") for key in loaded.state_dict())
    classify = pipeline("text-classification", model=str(model_dir))
    assert classify("a brilliant and warm film")[0]["label"] == "positive"
    assert classify("a dull and tedious plot")[0]["label"] == "negative"
    card = (model_dir / "README.md").read_text()
    assert f"{100 * trainer.metrics['test']['accuracy']:.2f}%" in card
    saved = json.loads((model_dir / "metrics.json").read_text())
    assert saved["metrics"]["test"]["f1"] == trainer.metrics["test"]["f1"]


def test_resume_after_the_epoch_2_checkpoint_starts_epoch_3(make_config, tmp_path: Path) -> None:
    config = make_config(epochs=3, checkpoint_every_steps=0, keep_checkpoints=10)
    full = run(config, tmp_path / "full.jsonl")
    epoch_two = next(i for i in list_checkpoints(config.runtime.checkpoint_dir)
                     if i.meta["epoch"] == 2 and i.meta["epoch_end"])
    drop_checkpoints_after(config.runtime.checkpoint_dir, epoch_two.step)

    resumed = run(config, tmp_path / "resumed.jsonl")
    assert resumed.resumed_from is not None and resumed.resumed_from.step == epoch_two.step
    epochs = {m["data"]["epoch"] for m in records(tmp_path / "resumed.jsonl", "metric")}
    assert epochs == {3}
    assert weights_checksum(resumed.model) == weights_checksum(full.model)


def test_resume_mid_epoch_matches_an_uninterrupted_run(make_config, tmp_path: Path) -> None:
    config = make_config(epochs=2, checkpoint_every_steps=5, keep_checkpoints=10)
    full = run(config, tmp_path / "full.jsonl")
    drop_checkpoints_after(config.runtime.checkpoint_dir, 5)

    resumed = run(config, tmp_path / "resumed.jsonl")
    metrics = records(tmp_path / "resumed.jsonl", "metric")
    assert metrics[0]["data"]["step"] == 6 and metrics[0]["data"]["epoch"] == 1
    for name, tensor in full.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], tensor)


def test_sample_ids_logged_per_step_cover_each_epoch_once(make_config, tmp_path: Path) -> None:
    config = make_config(epochs=2)
    config.runtime.log_sample_ids = True
    trainer = run(config, tmp_path / "reports.jsonl")
    by_epoch: dict[int, list[int]] = {1: [], 2: []}
    for record in records(tmp_path / "reports.jsonl", "samples"):
        by_epoch[record["data"]["epoch"]].extend(record["data"]["ids"])
    for ids in by_epoch.values():
        assert sorted(ids) == list(range(trainer.data_sizes["train"]))


def test_a_restart_after_the_last_step_redoes_no_finished_phase(make_config, tmp_path: Path,
                                                               monkeypatch) -> None:
    """Restart mode, a peer killed in each phase after the last step in turn: the epoch end's
    validation, the test evaluation and the export each run once in all."""
    config = make_config(epochs=1, checkpoint_every_steps=0)
    checkpoints, model_dir = config.runtime.checkpoint_dir, config.runtime.model_dir
    # A participant of a group of two: a failed collective calls for an emergency checkpoint.
    monkeypatch.setattr(Recovery, "saves_on_failure", lambda self, participants: True)
    evaluated: list[str] = []
    killed_during: list[str] = []
    evaluate = Trainer.evaluate

    def evaluate_or_lose_the_peer(self: Trainer, data, split):  # type: ignore[no-untyped-def]
        evaluated.append(split)
        if split in killed_during:
            killed_during.remove(split)
            raise RuntimeError("the collective failed: a peer was killed")
        return evaluate(self, data, split)

    monkeypatch.setattr(Trainer, "evaluate", evaluate_or_lose_the_peer)
    killed_during.append("validation")
    with pytest.raises(RuntimeError, match="peer was killed"):
        run(config, tmp_path / "1.jsonl")
    [emergency] = list_checkpoints(checkpoints)
    assert emergency.meta["emergency"] and not emergency.meta["epoch_end"]
    assert emergency.meta["epoch"] == 1  # the epoch of its last step, not the next one

    killed_during.append("test")  # the restart validates, then loses a peer in the test
    with pytest.raises(RuntimeError, match="peer was killed"):
        run(config, tmp_path / "2.jsonl")
    [validated] = list_checkpoints(checkpoints)
    assert (validated.step, validated.path.name) == (emergency.step, f"step-{emergency.step}.r1")
    assert validated.meta["epoch_end"] and validated.val_accuracy is not None
    assert sorted(p.name for p in checkpoints.iterdir()) == [validated.path.name]

    finished = run(config, tmp_path / "3.jsonl")
    assert evaluated == ["validation", "validation", "test", "test"]
    exported = (model_dir / "config.json").stat().st_mtime_ns

    # A peer killed after the export, before the job was seen to end: the next run reports.
    again = run(config, tmp_path / "4.jsonl")
    assert evaluated == ["validation", "validation", "test", "test"]
    assert (model_dir / "config.json").stat().st_mtime_ns == exported
    assert again.metrics == finished.metrics
    [completed] = [e["data"] for e in records(tmp_path / "4.jsonl", "event")
                   if e["data"]["type"] == "completed"]
    assert completed["model_dir"] == str(model_dir) and completed["metrics"] == finished.metrics
    [test] = records(tmp_path / "4.jsonl", "eval")
    assert test["data"]["accuracy"] == finished.metrics["test"]["accuracy"]


class Killed(BaseException):
    """The process ends where it is, as on a SIGKILL: no handler of the trainer's runs."""


@pytest.mark.parametrize("ending", ["killed", "failed"])
def test_a_step_is_reported_once_the_pod_has_outlived_it(make_config, tmp_path: Path,
                                                         monkeypatch, ending: str) -> None:
    """A collective can complete at one participant and fail at another: a pod killed as it
    commits a step that its peers failed, and redo, must not have reported it. The fourth
    step's collective fails here. Killed, the pod reported steps 1 and 2 alone. Failed, it
    lives to keep step 3 in an emergency checkpoint, the step a restart resumes from: step 3
    is reported too, with the time it committed."""
    config = make_config(epochs=1, checkpoint_every_steps=0)
    config.runtime.log_sample_ids = True
    # A participant of a group of two: a failed collective calls for an emergency checkpoint.
    monkeypatch.setattr(Recovery, "saves_on_failure", lambda self, participants: True)
    train_step = Trainer.train_step
    committed_at: list[float] = []

    def fourth_fails(self: Trainer):  # type: ignore[no-untyped-def]
        if len(committed_at) == 3:
            committed_at.append(time.time())
            raise Killed() if ending == "killed" else RuntimeError("the collective failed")
        result = train_step(self)
        committed_at.append(time.time())
        return result

    monkeypatch.setattr(Trainer, "train_step", fourth_fails)
    reports = tmp_path / "reports.jsonl"
    reporter = Reporter("test-0", "i", [JsonlSink(reports, "test-0", "i")])
    trainer = Trainer(config, Group(choose_device(), environ={}), reporter)
    with pytest.raises(Killed if ending == "killed" else RuntimeError):
        trainer.train()
    reporter.close()

    kept = [1, 2] if ending == "killed" else [1, 2, 3]
    metrics = records(reports, "metric")
    assert [m["data"]["step"] for m in metrics] == kept
    assert [s["data"]["step"] for s in records(reports, "samples")] == kept
    checkpoints = [info.step for info in list_checkpoints(config.runtime.checkpoint_dir)]
    assert checkpoints == ([] if ending == "killed" else [3])
    if ending == "failed":
        assert committed_at[2] <= metrics[-1]["time"] <= committed_at[3]


@pytest.mark.parametrize(("spec", "message"), [
    ({"model": "no-such-dir/"}, "no-such-dir"),
    ({"dataset": "missing.csv"}, "no such file"),
])
def test_bad_inputs_fail_before_training(make_config, spec: dict, message: str) -> None:
    from trainer.data import DataError
    from trainer.model import ModelError

    with pytest.raises((DataError, ModelError), match=message):
        Trainer(make_config(**spec), Group(choose_device(), environ={}), Reporter("p"))


def test_skipped_steps_keep_the_weights_and_use_their_samples_once(
        make_config, inputs_dir: Path, tmp_path: Path) -> None:
    """A real cause: a corrupt [UNK] embedding that one training text reaches makes its steps'
    loss NaN, once per epoch; `skip` commits those steps without their update."""
    make_poisoned_model(inputs_dir / "poisoned")
    make_poisoned_csv(inputs_dir / "poisoned.csv")
    config = make_config(model="poisoned", dataset="poisoned.csv", nonfinite_loss="skip",
                         epochs=3)
    config.runtime.log_sample_ids = True
    reports = tmp_path / "reports.jsonl"
    reporter = Reporter("test-0", "i", [JsonlSink(reports, "test-0", "i")])
    trainer = Trainer(config, Group(choose_device(), environ={}), reporter)
    expected = poisoned_steps(config.spec, inputs_dir, epochs=3)
    trainer.train()
    reporter.close()

    skipped = [e["data"] for e in records(reports, "event")
               if e["data"]["type"] == "step_skipped"]
    assert [(e["step"], e["non_finite"], e["loss"], e["skipped"]) for e in skipped] == [
        (step, "nan", None, count) for count, step in enumerate(expected, 1)]
    assert skipped[0]["message"] == f"step {expected[0]} skipped: loss became nan at step " \
                                    f"{expected[0]}"
    assert trainer.skipped_steps == 3
    steps = [m["data"]["step"] for m in records(reports, "metric")]
    assert steps == [s for s in range(1, trainer.step + 1) if s not in expected]
    assert all(math.isfinite(m["data"]["loss"]) for m in records(reports, "metric"))
    # The skipped steps' samples count as used: each epoch's samples once, theirs included.
    by_epoch: dict[int, list[int]] = {1: [], 2: [], 3: []}
    for record in records(reports, "samples"):
        by_epoch[record["data"]["epoch"]].extend(record["data"]["ids"])
    for ids in by_epoch.values():
        assert sorted(ids) == list(range(trainer.data_sizes["train"]))
    # No update came from them: every weight but the corrupt row stays finite, and it learns.
    for name, tensor in trainer.model.state_dict().items():
        if name != "bert.embeddings.word_embeddings.weight":
            assert torch.isfinite(tensor).all(), name
    assert trainer.metrics["test"]["accuracy"] >= 0.9


def test_an_uploaded_dataset_of_three_classes_trains_a_model_that_names_them(
        make_config, inputs_dir: Path, tmp_path: Path) -> None:
    from transformers import pipeline

    config = make_config(dataset=make_uploaded_dataset(inputs_dir, rows=300), epochs=4,
                         checkpoint_every_steps=0)
    trainer = run(config, tmp_path / "reports.jsonl")
    test = trainer.metrics["test"]
    assert test["accuracy"] >= 0.85  # a third by chance
    assert 0.8 <= test["f1"] <= 1  # macro: the mean of the three classes' F1
    classify = pipeline("text-classification", model=str(config.runtime.model_dir))
    assert classify.model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert classify("a brilliant and warm film")[0]["label"] == "positive"
    assert classify("the film was very dull and tedious")[0]["label"] == "negative"
    assert "labels `negative`, `neutral`, `positive`" in " ".join(
        (config.runtime.model_dir / "README.md").read_text().split())


class HealingGroup(Group):
    heals = True


@pytest.mark.parametrize("group_type", [Group, HealingGroup])
def test_a_pod_that_may_heal_holds_its_optimizers_state_before_its_first_step(
        make_config, group_type: type[Group]) -> None:
    """A heal reads the source's moments into them in place, so their memory is touched
    before the pod joins a quorum; a pod that cannot heal leaves that to its first update."""
    trainer = Trainer(make_config(), group_type(choose_device(), environ={}), Reporter("p"))
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    state = trainer.optimizer.state
    if group_type is HealingGroup:
        assert trainable and all(
            state[p]["step"].item() == 0 and torch.equal(state[p]["exp_avg"], torch.zeros_like(p))
            and torch.equal(state[p]["exp_avg_sq"], torch.zeros_like(p)) for p in trainable)
    else:
        assert not state
