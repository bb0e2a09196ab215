"""Pipeline parallelism: the cut, and a real two-stage pipeline (two processes, gloo) that
trains exactly as the whole model does in one process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import Processes
from tests.support import free_port
from trainer import pipeline
from trainer.pipeline import PipelineError, Stage

STEPS, BATCH, WIDTH = 3, 8, 12

# A tiny BERT with dropout off, seeded: every process builds the same one.
MODEL = """
import torch
from transformers import BertConfig, BertForSequenceClassification

def tiny_model():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)

def batches(steps, batch, width):
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(1, 50, (batch, width), generator=generator)
        lengths = torch.randint(3, width + 1, (batch,), generator=generator)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        labels = torch.randint(0, 2, (batch,), generator=generator)
        yield ids * mask, mask, labels
"""

WORKER = MODEL + """
import json, os, sys
import torch.distributed as dist
from trainer import pipeline

rank, schedule_name = int(os.environ["RANK"]), sys.argv[1]
microbatches, steps, batch, width = (int(arg) for arg in sys.argv[2:])
dist.init_process_group("gloo", rank=rank, world_size=2)
model = tiny_model()
stage = pipeline.Stage(model, rank, 2)
schedule = pipeline.build_schedule(stage, torch.device("cpu"), None, schedule_name, microbatches)
optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-2)
losses = []
for ids, mask, labels in batches(steps, batch, width):
    target = pipeline.targets(labels, 1.0 / len(labels), len(labels))
    loss = pipeline.run_step(schedule, stage, ids, mask, target)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss)
weights = {name: p.detach().flatten().tolist()
           for name, p in pipeline.parameter_names(model, stage).items()}
print(json.dumps({"losses": losses, "weights": weights}), flush=True)
dist.destroy_process_group()
"""


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """The whole model in this process: the mean loss per step and the final weights."""
    scope: dict[str, object] = {}
    exec(MODEL, scope)
    model = scope["tiny_model"]()  # type: ignore[operator]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for ids, mask, labels in scope["batches"](STEPS, BATCH, WIDTH):  # type: ignore[operator]
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_two_stage_pipeline_trains_as_the_whole_model(
        schedule: str, tmp_path: Path, processes: Processes) -> None:
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", WORKER, schedule, *(str(n) for n in (4, STEPS, BATCH, WIDTH))]
    workers = [processes.start(argv,
                               {**env, "RANK": str(rank)}, tmp_path / f"stage-{rank}.log")
               for rank in (0, 1)]
    for rank, worker in enumerate(workers):
        assert worker.wait(timeout=120) == 0, (tmp_path / f"stage-{rank}.log").read_text()
    reports = [json.loads((tmp_path / f"stage-{rank}.log").read_text().splitlines()[-1])
               for rank in (0, 1)]
    losses, weights = reference()
    assert reports[0]["losses"] == [None] * STEPS
    assert reports[1]["losses"] == pytest.approx(losses, abs=1e-4)
    stage_weights = {**reports[0]["weights"], **reports[1]["weights"]}
    assert set(stage_weights) == set(weights)  # the stages hold the whole model between them
    assert not set(reports[0]["weights"]) & set(reports[1]["weights"])
    for name, values in stage_weights.items():
        torch.testing.assert_close(torch.tensor(values), weights[name].flatten(),
                                   atol=1e-5, rtol=0)


def tiny() -> torch.nn.Module:
    scope: dict[str, object] = {}
    exec(MODEL, scope)
    return scope["tiny_model"]()  # type: ignore[operator,no-any-return]


def test_layers_are_divided_evenly_later_stages_taking_the_remainder() -> None:
    assert pipeline.stage_layers(12, 2) == [range(0, 6), range(6, 12)]
    assert pipeline.stage_layers(6, 4) == [range(0, 1), range(1, 2), range(2, 4), range(4, 6)]
    with pytest.raises(PipelineError, match="pipeline_stages must be between 2 and the model's 6"):
        pipeline.stage_layers(6, 7)


def test_stages_hold_their_parts_of_the_model() -> None:
    model = tiny()
    first, last = Stage(model, 0, 2), Stage(model, 1, 2)
    assert first.embeddings is not None and first.classifier is None
    assert last.embeddings is None and last.classifier is not None
    names = pipeline.parameter_names(model, first)
    assert any(n.startswith("bert.embeddings.") for n in names)
    assert {n.split(".")[3] for n in names if n.startswith("bert.encoder.layer.")} == {"0", "1"}


def test_a_model_of_another_architecture_is_refused() -> None:
    with pytest.raises(PipelineError, match="BERT-architecture"):
        Stage(torch.nn.Linear(2, 2), 0, 2)


def test_microbatches_must_divide_the_batch() -> None:
    pipeline.check_microbatches(16, 4)
    with pytest.raises(PipelineError, match=r"microbatches \(3\) must divide batch_size \(16\)"):
        pipeline.check_microbatches(16, 3)
