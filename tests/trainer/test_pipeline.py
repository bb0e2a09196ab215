"""Pipeline parallelism: the cut, a real two-stage pipeline (two processes, gloo), and two
pipelines of two stages (four processes): each trains and evaluates exactly as the whole model
does in one process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import Process, Processes, outputs
from trainer import pipeline
from trainer.checkpoint import CheckpointWriter
from trainer.checkpointer import Save
from trainer.distributed import Group
from trainer.evaluation import evaluate
from trainer.model import DeviceChoice, choose_device
from trainer.pipeline import Pipelined, PipelineError, Stage

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
    argv = [sys.executable, "-c", WORKER, schedule, *(str(n) for n in (4, STEPS, BATCH, WIDTH))]
    stages = processes.world(argv, [tmp_path / f"stage-{rank}.log" for rank in (0, 1)],
                             {"OMP_NUM_THREADS": "1"})
    reports = [json.loads(text.splitlines()[-1]) for text in outputs(stages, timeout=120)]
    losses, weights = reference()
    assert reports[0]["losses"] == [None] * STEPS
    assert reports[1]["losses"] == pytest.approx(losses, abs=1e-4)
    stage_weights = {**reports[0]["weights"], **reports[1]["weights"]}
    assert set(stage_weights) == set(weights)  # the stages hold the whole model between them
    assert not set(reports[0]["weights"]) & set(reports[1]["weights"])
    for name, values in stage_weights.items():
        torch.testing.assert_close(torch.tensor(values), weights[name].flatten(),
                                   atol=1e-5, rtol=0)


# Two pipeline replicas of two stages: every step's window split between the replicas (the
# last one unevenly), each replica's share padded to ROWS rows and a width bucket, the stages'
# gradients averaged over the replicas and clipped by the whole model's norm.
WINDOWS, ROWS = (16, 16, 13), 8

SAMPLES = """
def samples(count):
    generator = torch.Generator().manual_seed(2)
    lengths = torch.randint(3, 21, (count,), generator=generator)
    rows = [torch.randint(1, 50, (int(n),), generator=generator) for n in lengths]
    labels = torch.randint(0, 2, (count,), generator=generator)
    return rows, labels

def batch(rows, labels, ids):
    width = max(len(rows[i]) for i in ids)
    input_ids = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, i in enumerate(ids):
        input_ids[row, :len(rows[i])] = rows[i]
        mask[row, :len(rows[i])] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels[ids]}

class Split:  # what evaluate reads of a TokenizedSplit
    def __init__(self, rows, labels):
        self.rows, self.labels = rows, labels
    def __len__(self):
        return len(self.rows)
    def batch(self, ids):
        return batch(self.rows, self.labels, [int(i) for i in ids])
"""
EVAL_SAMPLES, EVAL_BATCH = 11, 4

HYBRID = MODEL + SAMPLES + """
import json, os, sys
import numpy as np
from trainer import pipeline
from trainer.model import DeviceChoice
from trainer.pipeline_group import PipelineGroup

windows = [int(w) for w in sys.argv[2].split(",")]
ordinal = int(os.environ["ORDINAL"]) if "ORDINAL" in os.environ else None
group = PipelineGroup(DeviceChoice(torch.device("cpu"), "gloo", None), 2, os.environ,
                      ordinal=ordinal)
model = tiny_model()
runner = pipeline.PipelineModel(model, group, sys.argv[1], 4, int(sys.argv[3]), 32)
optimizer = torch.optim.AdamW(runner.stage.parameters(), lr=1e-2)
rows, labels = samples(sum(windows))
losses, start = [], 0
for window in windows:
    share = np.array_split(np.arange(start, start + window), group.participants)[group.rank]
    start += window
    loss, _ = runner.forward_backward(batch(rows, labels, share.tolist()), 1.0,
                                      group.participants / window)
    runner.sync_and_clip(1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    total = torch.tensor([loss], dtype=torch.float64)
    losses.append(group.all_reduce_sum(total).item() / window)
weights = {name: p.detach().flatten().tolist()
           for name, p in pipeline.parameter_names(model, runner.stage).items()}
from trainer.evaluation import evaluate
evaluation = evaluate(runner.stage, Split(*samples(int(sys.argv[4]))), group, int(sys.argv[5]),
                      runner.logits)
gathered = runner.gather_state()  # the export's: the whole model on one pod
print(json.dumps({"losses": losses, "weights": weights, "evaluation": evaluation,
                  "stage": group.stage, "primary": group.is_primary,
                  "gathered": gathered is not None,
                  "replica": group.replica, "widths": sorted(runner._schedules)}), flush=True)
# As trainer/__main__.py does: gloo ranks tearing their groups down at the same moment were
# seen to abort after a successful run ("terminate called without an active exception").
os._exit(0)
"""


def hybrid_reference() -> tuple[list[float], dict[str, torch.Tensor], dict[str, float]]:
    scope: dict[str, object] = {}
    exec(MODEL + SAMPLES, scope)
    model = scope["tiny_model"]()  # type: ignore[operator]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rows, labels = scope["samples"](sum(WINDOWS))  # type: ignore[operator]
    losses, start = [], 0
    for window in WINDOWS:
        batch = scope["batch"](rows, labels, list(range(start, start + window)))  # type: ignore[operator]
        start += window
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    split = scope["Split"](*scope["samples"](EVAL_SAMPLES))  # type: ignore[operator]
    evaluation = evaluate(model, split, Group(choose_device(), environ={}), EVAL_BATCH)
    return losses, {name: p.detach() for name, p in model.named_parameters()}, evaluation


@pytest.mark.parametrize("ordinals", [None, [2, 0, 3, 1]], ids=["by-rank", "by-ordinal"])
def test_two_pipelines_of_two_stages_train_as_the_whole_model(
        ordinals: list[int] | None, tmp_path: Path, processes: Processes) -> None:
    """Roles follow the pods' ordinals, whatever ranks the rendezvous handed out."""
    ordinal_of = ordinals or list(range(4))
    argv = [sys.executable, "-c", HYBRID, "1f1b", ",".join(map(str, WINDOWS)), str(ROWS),
            str(EVAL_SAMPLES), str(EVAL_BATCH)]
    ranks = processes.world(argv, [tmp_path / f"rank-{rank}.log" for rank in range(4)],
                            {"OMP_NUM_THREADS": "1"},
                            [{"ORDINAL": str(o)} for o in ordinals] if ordinals else None)
    reports = [json.loads(text.splitlines()[-1]) for text in outputs(ranks, timeout=180)]
    assert [(r["replica"], r["stage"]) for r in reports] == [(o // 2, o % 2) for o in ordinal_of]
    reports = [reports[ordinal_of.index(o)] for o in range(4)]  # by ordinal from here on
    # The primary, which exports and completes checkpoints, is the pod the whole model is
    # gathered on: ordinal 0, whichever rank it has (after a restart's rendezvous, any).
    assert [r["primary"] for r in reports] == [True, False, False, False]
    assert [r["gathered"] for r in reports] == [True, False, False, False]
    losses, weights, evaluation = hybrid_reference()
    for report in reports:  # every pod reports the step's loss over the whole window
        assert report["losses"] == pytest.approx(losses, abs=1e-4)
        # ... and the evaluation of the whole split, each replica having evaluated a shard
        assert report["evaluation"] == pytest.approx(evaluation, abs=1e-5)
        assert report["evaluation"]["samples"] == EVAL_SAMPLES
    step = pipeline.PipelineModel.WIDTH_STEP
    assert all(r["widths"] and all(w % step == 0 and w <= 32 for w in r["widths"])
               for r in reports)
    for replica in (0, 1):  # each replica holds the whole model, and the same one
        held = {**reports[2 * replica]["weights"], **reports[2 * replica + 1]["weights"]}
        assert set(held) == set(weights)
        for name, values in held.items():
            torch.testing.assert_close(torch.tensor(values), weights[name].flatten(),
                                       atol=1e-5, rtol=0)


# A fixed global batch (trainer.shards) through pipelines: 3 shards of ROWS a step, shared by
# two replicas (two shards and one) or all computed by one, with dropout on; the steps of 24, 24
# and 8 samples (the last a lone shard).
SHARDED_SAMPLES, GLOBAL = 56, 24

SHARDED = MODEL.replace("_prob=0.0", "_prob=0.1") + SAMPLES + """
import json, os, sys
from types import SimpleNamespace
from trainer import pipeline
from trainer.model import DeviceChoice
from trainer.pipeline_group import PipelineGroup
from trainer.sampler import GlobalSampler
from trainer.shards import ShardSums

rows, global_batch, count = (int(arg) for arg in sys.argv[1:])
group = PipelineGroup(DeviceChoice(torch.device("cpu"), "gloo", None), 2, os.environ)
model = tiny_model()
model.train()
runner = pipeline.PipelineModel(model, group, "1f1b", 2, rows, 32)
optimizer = torch.optim.AdamW(runner.stage.parameters(), lr=1e-2)
sums = ShardSums(runner, group)
sampler = GlobalSampler(count, rows, seed=5, global_batch=global_batch)
data = Split(*samples(count))
spec = SimpleNamespace(seed=5, batch_size=rows, max_grad_norm=1.0)
losses = []
while sampler.epoch == 0:
    assignment = sampler.assign(group.rank, group.participants)
    loss, counted, _ = sums.step(assignment, data, False, spec)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sampler.commit(assignment)
    losses.append((loss, counted))
weights = {name: p.detach().flatten().tolist()
           for name, p in pipeline.parameter_names(model, runner.stage).items()}
print(json.dumps({"losses": losses, "weights": weights, "stage": group.stage,
                  "replica": group.replica}), flush=True)
os._exit(0)
"""


def start_sharded(pods: int, tmp_path: Path, processes: Processes) -> list[tuple[Process, Path]]:
    argv = [sys.executable, "-c", SHARDED, str(ROWS), str(GLOBAL), str(SHARDED_SAMPLES)]
    return processes.world(argv, [tmp_path / f"{pods}-pods-rank-{r}.log" for r in range(pods)],
                           {"OMP_NUM_THREADS": "1"})


def reports_of(workers: list[tuple[Process, Path]]) -> list[dict[str, Any]]:
    return [json.loads(text.splitlines()[-1]) for text in outputs(workers, timeout=180)]


def test_two_pipelines_train_bitwise_what_one_trains_alone_with_a_fixed_global_batch(
        tmp_path: Path, processes: Processes) -> None:
    """Each replica's stages compute their shards, each stage sums its gradients over the
    replicas in float64: who computed which shard changes no bit, dropout included."""
    one, two = start_sharded(2, tmp_path, processes), start_sharded(4, tmp_path, processes)
    alone, shared = reports_of(one), reports_of(two)
    assert [(r["replica"], r["stage"]) for r in shared] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    steps = alone[1]["losses"]
    assert [counted for _, counted in steps] == [GLOBAL, GLOBAL, SHARDED_SAMPLES - 2 * GLOBAL]
    for report in [*alone, *shared]:  # every stage reports the step's loss, to the bit
        assert report["losses"] == steps
    for report in shared:
        reference = alone[report["stage"]]["weights"]
        assert report["weights"].keys() == reference.keys()
        assert all(report["weights"][name] == values for name, values in reference.items())


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


class HealingStage(Group, Pipelined):
    """Stage 0 of 2 of a replica that healed in this step: rank 0, as torchft's participants
    count it (it took no part), and no primary."""

    def __init__(self) -> None:
        self.device = DeviceChoice(torch.device("cpu"), "gloo", None)
        self.stage, self.stages, self.stage_ranks, self.pipeline_group = 0, 2, [0, 1], None
        self.barriers = 0

    rank = 0
    healing = True
    is_primary = False

    def barrier(self) -> None:
        self.barriers += 1


def test_a_replica_that_healed_in_the_step_writes_no_shard(tmp_path: Path) -> None:
    group = HealingStage()
    part = pipeline.PipelineModel(tiny(), group, "1f1b", 2, 4, 32)
    done: list[object] = []
    part.save_checkpoint(Save(tmp_path, 10, {}, 3, False, False, dict, done.append),
                         CheckpointWriter())
    # Replica 0 writes step 10's shards and completes them: a second writer of the same staging
    # directory could find it moved away mid-write (a killed live pipeline's replica did).
    assert list(tmp_path.iterdir()) == [] and done == []
    assert group.barriers == 1  # it still meets its replica's other stage
