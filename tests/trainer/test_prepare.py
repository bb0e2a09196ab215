"""trainer.prepare.warm_up: a standby's thrown-away step leaves the model as it was, and the
memory of its first update is touched ahead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.factories import make_reviews_csv, tiny_spec
from trainer import allocator
from trainer.config import JobSpec, Runtime, TrainConfig
from trainer.model import choose_device
from trainer.prepare import FIRST_STEP_HEAP, Prepared, prepare, warm_up


def prepared_job(inputs: Path, work: Path, **overrides: object) -> tuple[Prepared, JobSpec]:
    make_reviews_csv(inputs / "reviews.csv", rows=60)
    spec = JobSpec.model_validate(tiny_spec(**overrides))
    runtime = Runtime(inputs_dir=inputs, cache_dir=work / "cache", checkpoint_dir=work / "ckpt")
    return prepare(TrainConfig(spec, runtime), torch.device("cpu")), spec


def test_the_warm_up_runs_a_backward_and_changes_no_weight_random_state_or_mode(
        inputs_dir: Path, tmp_path: Path) -> None:
    prepared, spec = prepared_job(inputs_dir, tmp_path)
    model = prepared.model
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    backwards: list[int] = []
    head = next(p for name, p in model.named_parameters() if name.startswith("classifier"))
    head.register_hook(lambda grad: backwards.append(grad.numel()))
    random_state = torch.get_rng_state()
    assert not model.training

    warm_up(prepared, spec, choose_device())

    assert backwards == [head.numel()]
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), random_state)  # dropout drew from a fork
    assert not model.training


def test_a_pipeline_pod_is_not_warmed_up_with_the_whole_model(inputs_dir: Path,
                                                              tmp_path: Path) -> None:
    prepared, spec = prepared_job(inputs_dir, tmp_path, parallelism="pipeline", replicas=1,
                                  pipeline_stages=2)
    backwards: list[int] = []
    for p in prepared.model.parameters():
        p.register_hook(lambda grad: backwards.append(1))
    warm_up(prepared, spec, choose_device())
    assert backwards == []


def test_the_warm_up_reserves_the_first_updates_memory_on_a_cpu(
        inputs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared, spec = prepared_job(inputs_dir, tmp_path)
    asked: list[int] = []

    def reserve(nbytes: int) -> bool:
        asked.append(nbytes)
        return True

    monkeypatch.setattr(allocator, "reserve", reserve)
    warm_up(prepared, spec, choose_device())
    trainable = sum(p.numel() * 4 for p in prepared.model.parameters() if p.requires_grad)
    assert asked == [FIRST_STEP_HEAP * trainable]
