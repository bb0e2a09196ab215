"""Finishing a job early (trainer.finish): the votes ride the step's own sum, every participant
settles on the same epoch, and a job finished after epoch N holds the weights that a whole run
holds at the end of epoch N."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.trainer.test_shards import (
    GLOBAL,
    ROWS,
    SAMPLES,
    SPEC,
    Participant,
    part,
    reviews,
    tiny_bert,
)
from trainer.checkpoint import list_checkpoints, load_checkpoint
from trainer.distributed import Group
from trainer.finish import Finish
from trainer.model import choose_device
from trainer.report import Reporter
from trainer.sampler import GlobalSampler
from trainer.shards import ShardSums
from trainer.state import weights_checksum
from trainer.train import Trainer


class Hearing:
    """A report sink that keeps every record and hears the control plane ask for a finish after
    `epoch` once the pod has reported a step of epoch `heard_in` (as a reply to its reports)."""

    def __init__(self, epoch: int, heard_in: int) -> None:
        self.epoch, self.heard_in = epoch, heard_in
        self.finish_after_epoch: int | None = None
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if record["kind"] == "metric" and record["data"]["epoch"] >= self.heard_in:
            self.finish_after_epoch = self.epoch

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def close(self, timeout: float | None = None) -> None:
        pass

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [r["data"] for r in self.records
                if r["kind"] == "event" and r["data"]["type"] == kind]


def test_a_pod_votes_once_asked_and_settles_on_the_asked_epoch_or_the_one_under_way() -> None:
    sink = Hearing(epoch=2, heard_in=1)
    finish = Finish(Reporter("job-0", "i", [sink]), epochs=5, agrees=True)
    assert finish.votes().tolist() == [0.0, 0.0] and finish.last_epoch == 5
    finish.settle(torch.zeros(2, dtype=torch.float64), epoch=0, step=3)  # nobody was asked
    assert finish.epoch is None
    sink.finish_after_epoch = 2
    assert finish.votes().tolist() == [1.0, 2.0]
    # Two of three participants were asked for epoch 2, during epoch 3 (from 0: 2): the job
    # ends after epoch 3, the one under way.
    finish.settle(torch.tensor([2.0, 4.0], dtype=torch.float64), epoch=2, step=9)
    assert finish.epoch == 3 and finish.last_epoch == 3
    assert finish.votes().tolist() == [0.0, 0.0]  # settled: nothing more to say
    finish.settle(torch.tensor([1.0, 5.0], dtype=torch.float64), epoch=3, step=10)
    assert finish.epoch == 3
    (finishing,) = sink.events("finishing")
    assert (finishing["epoch"], finishing["step"]) == (3, 9)


def test_a_pod_of_a_group_that_sums_no_statistics_never_votes() -> None:
    sink = Hearing(epoch=1, heard_in=1)
    sink.finish_after_epoch = 1
    finish = Finish(Reporter("job-0", "i", [sink]), epochs=3, agrees=False)
    assert finish.votes().tolist() == [0.0, 0.0]


class TwoParticipants(Participant):
    """This participant's sum with another's, which holds `other` in its last elements."""

    def __init__(self, other: list[float]) -> None:
        super().__init__()
        self.other = torch.tensor(other, dtype=torch.float64)

    def sum_exactly(self, values: torch.Tensor) -> torch.Tensor:
        super().sum_exactly(values)
        values[-len(self.other):] += self.other
        return values


def test_the_votes_ride_the_steps_one_sum_to_a_pod_that_heard_nothing() -> None:
    """The gradients' collective carries them: no other collective a failure could split."""
    group = TwoParticipants([0.0, 0.0, 1.0, 2.0])  # its loss and samples, then its votes
    sums = ShardSums(part(tiny_bert(), group), group)
    sampler = GlobalSampler(SAMPLES, ROWS, seed=5, global_batch=GLOBAL)
    votes = torch.zeros(2, dtype=torch.float64)
    sums.step(sampler.assign(0, 2), reviews(), False, SPEC, votes)  # type: ignore[arg-type]
    (sent,) = group.sent
    assert sent[-2:].tolist() == [0.0, 0.0]
    assert votes.tolist() == [1.0, 2.0]


def test_a_job_finished_after_an_epoch_holds_what_a_whole_run_holds_after_it(
        make_config, tmp_path: Path) -> None:
    """Asked during epoch 2 to finish after epoch 1, the job ends after epoch 2 (the one under
    way), with the weights of a 4-epoch run's epoch-2 checkpoint, to the bit: the learning
    rate's schedule stays the whole run's. Then it evaluates on test and exports."""
    whole = make_config(epochs=4, checkpoint_every_steps=0, keep_checkpoints=10)
    Trainer(whole, Group(choose_device(), environ={}), Reporter("test-0", "i")).train()
    epoch_two = next(i for i in list_checkpoints(whole.runtime.checkpoint_dir)
                     if i.meta["epoch"] == 2 and i.meta["epoch_end"])

    asked = make_config(epochs=4, checkpoint_every_steps=0)
    asked.runtime = asked.runtime.model_copy(update={
        "checkpoint_dir": tmp_path / "asked-checkpoints", "model_dir": tmp_path / "asked"})
    sink = Hearing(epoch=1, heard_in=2)
    trainer = Trainer(asked, Group(choose_device(), environ={}), Reporter("test-0", "i", [sink]))
    trainer.train()
    assert trainer.step == epoch_two.step and trainer.sampler.epoch == 2
    model, _, _ = load_checkpoint(epoch_two.path)
    finished = trainer.model.state_dict()
    assert all(torch.equal(finished[name], tensor) for name, tensor in model.items())
    assert [e["epoch"] for e in sink.events("finishing")] == [2]
    assert [e["epoch"] for e in sink.events("epoch_end")] == [1, 2]
    (completed,) = sink.events("completed")
    assert completed["checksum"] == weights_checksum(trainer.model)
    assert completed["model_dir"] == str(tmp_path / "asked")
    assert (tmp_path / "asked" / "config.json").is_file()
    assert "test" in completed["metrics"]
