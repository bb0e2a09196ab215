"""A fixed global batch's step (trainer.shards): a redo after a failed attempt keeps what the
attempt computed, and the gradients it sends are those of a step computed afresh, to the bit."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from trainer.data import TokenizedSplit
from trainer.distributed import Group
from trainer.model import DeviceChoice
from trainer.sampler import GlobalSampler
from trainer.shards import ShardSums, input_embedding
from trainer.whole import WholeModel

CPU = DeviceChoice(torch.device("cpu"), "gloo", None)
SAMPLES, ROWS, GLOBAL = 48, 4, 24  # six shards a step
SPEC = SimpleNamespace(seed=5, batch_size=ROWS, max_grad_norm=1.0)


class Participant(Group):
    """One participant of a group of several: what it sends to the step's sum is recorded, and
    a failing collective leaves garbage behind, as one a peer died in may."""

    def __init__(self, redoes_steps: bool = True) -> None:
        super().__init__(CPU, environ={})
        self.redoes_steps = redoes_steps
        self.fail = False
        self.sent: list[torch.Tensor] = []

    @property
    def alone(self) -> bool:
        return False

    def sum_exactly(self, values: torch.Tensor) -> torch.Tensor:
        self.sent.append(values.clone())
        if self.fail:
            values.fill_(float("nan"))
        return values


class Counted(WholeModel):
    """The whole model, counting the shards it computes."""

    shards_computed = 0

    def shard_backward(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        self.shards_computed += 1
        return super().shard_backward(batch)


def tiny_bert() -> BertForSequenceClassification:
    """Dropout on: each shard's draw must come from the shard, not the attempt. The reviews
    read a tenth of its vocabulary."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=400, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = BertForSequenceClassification(config)
    model.train()
    return model


def reviews() -> TokenizedSplit:
    rng = np.random.default_rng(3)
    lengths = rng.integers(4, 20, SAMPLES)
    return TokenizedSplit(ids=rng.integers(1, 40, int(lengths.sum())).astype(np.int32),
                          offsets=np.concatenate([[0], np.cumsum(lengths)]),
                          labels=rng.integers(0, 2, SAMPLES), pad_id=0)


@pytest.fixture
def setup() -> tuple[BertForSequenceClassification, TokenizedSplit, GlobalSampler]:
    return tiny_bert(), reviews(), GlobalSampler(SAMPLES, ROWS, seed=5, global_batch=GLOBAL)


def attempt(sums: ShardSums, model: torch.nn.Module, sampler: GlobalSampler, rank: int,
            participants: int, data: TokenizedSplit) -> tuple[float, float, float]:
    """One attempt at the sampler's next step, as train_step makes it (no optimizer step: the
    attempts here never commit, so the weights stay those the step started from)."""
    result = sums.step(sampler.assign(rank, participants), data, False, SPEC)  # type: ignore[arg-type]
    model.zero_grad(set_to_none=True)
    return result


def part(model: torch.nn.Module, group: Group) -> Counted:
    config = SimpleNamespace(spec=SimpleNamespace(finetune="full", constant_batch=True))
    return Counted(model, group, config)  # type: ignore[arg-type]


@pytest.mark.parametrize(("before", "after"), [
    ((0, 3), (0, 2)),  # shards 0-1, then 0-2 (pod 1 of 3 died): only shard 2 is computed
    ((2, 3), (1, 2)),  # shards 4-5, then 3-5: only shard 3
])
def test_a_redo_computes_only_the_shards_its_failed_attempt_did_not_hold(
        setup: Any, before: tuple[int, int], after: tuple[int, int]) -> None:
    model, data, sampler = setup
    fresh_group = Participant()
    fresh = part(model, fresh_group)
    attempt(ShardSums(fresh, fresh_group), model, sampler, *after, data)

    group = Participant()
    counted = part(model, group)
    sums = ShardSums(counted, group)
    group.fail = True
    attempt(sums, model, sampler, *before, data)
    held = counted.shards_computed
    group.fail = False
    loss, samples, _ = attempt(sums, model, sampler, *after, data)

    wanted = len(sampler.assign(*after).shards)
    assert held == 2 and sums.kept_shards == held
    assert counted.shards_computed - held == wanted - held
    # What the redo sends to the participants' sum is what a fresh step sends, to the bit.
    assert torch.equal(group.sent[-1], fresh_group.sent[-1])
    assert samples == wanted * ROWS and loss == group.sent[-1][-2].item()


def test_a_failed_attempt_whose_shards_the_redo_does_not_all_hold_is_computed_again(
        setup: Any) -> None:
    model, data, sampler = setup
    fresh_group = Participant()
    attempt(ShardSums(part(model, fresh_group), fresh_group), model, sampler, 1, 2, data)
    group = Participant()
    counted = part(model, group)
    sums = ShardSums(counted, group)
    group.fail = True
    attempt(sums, model, sampler, 1, 3, data)  # shards 2-3; the redo's are 3-5
    group.fail = False
    attempt(sums, model, sampler, 1, 2, data)
    assert sums.kept_shards == 0 and counted.shards_computed == 2 + 3
    assert torch.equal(group.sent[-1], fresh_group.sent[-1])


@pytest.mark.parametrize("why", ["settled", "no redo in this group", "another step"])
def test_nothing_is_kept_once_the_step_settled_where_the_group_never_redoes_or_for_another_step(
        setup: Any, why: str) -> None:
    model, data, sampler = setup
    group = Participant(redoes_steps=why != "no redo in this group")
    counted = part(model, group)
    sums = ShardSums(counted, group)
    attempt(sums, model, sampler, 0, 3, data)
    if why == "settled":
        sums.settled()
    elif why == "another step":
        sampler.commit(sampler.assign(0, 3))
    attempt(sums, model, sampler, 0, 2, data)
    assert sums.kept_shards == 0 and counted.shards_computed == 2 + 3


def test_the_embedding_sums_only_the_steps_tokens_rows_and_its_gradient_is_the_dense_one(
        setup: Any) -> None:
    model, data, sampler = setup
    grads = {}
    for rows in ("the step's tokens", "every row"):
        group = Participant()
        sums = ShardSums(part(model, group), group)
        if rows == "every row":
            sums._embedding = None  # what a model whose embedding is tied gets
        sums.step(sampler.assign(0, 2), data, False, SPEC)  # type: ignore[arg-type]
        grads[rows] = ([p.grad.clone() for p in model.parameters()], group.sent[-1].numel())
        model.zero_grad(set_to_none=True)
    (sparse, sent), (dense, sent_dense) = grads["the step's tokens"], grads["every row"]
    assert all(torch.equal(a, b) for a, b in zip(sparse, dense, strict=True))
    window = sampler.assign(0, 2).window_ids
    assert window is not None
    tokens = data.tokens(window)
    vocabulary, width = model.get_input_embeddings().weight.shape
    assert len(tokens) < vocabulary and sent_dense - sent == (vocabulary - len(tokens)) * width
    # The rows left out are those no sample of the step reads: their gradient is zero.
    unread = np.setdiff1d(np.arange(vocabulary), tokens)
    assert not dense[0][unread].any() and dense[0][tokens[1:]].any()


def test_an_embedding_tied_to_an_output_layer_sums_every_row() -> None:
    model = torch.nn.Module()
    model.embedding = torch.nn.Embedding(10, 4)
    model.get_input_embeddings = lambda: model.embedding  # type: ignore[assignment]
    parameters = list(model.parameters())
    assert input_embedding(model, parameters) == 0
    model.get_output_embeddings = lambda: model.embedding  # type: ignore[assignment]
    assert input_embedding(model, parameters) is None
