"""What a committed step reports (trainer.progress), with the trainer's own sampler and group."""

import json
from pathlib import Path

import numpy as np

from trainer.distributed import Group
from trainer.model import choose_device
from trainer.progress import StepReports, StepResult
from trainer.report import JsonlSink, Reporter
from trainer.sampler import GlobalSampler


def test_a_pod_that_healed_into_a_step_reports_its_window_but_no_metric(
        make_config, tmp_path: Path) -> None:
    """Its state holds the step, which its peers computed: where they all die before their
    reports leave, the step's window stays on record from the pod that healed."""
    config = make_config()
    config.runtime.log_sample_ids = True
    path = tmp_path / "reports.jsonl"
    reporter = Reporter("test-0", "i", [JsonlSink(path, "test-0", "i")])
    sampler = GlobalSampler(num_samples=40, batch_size=4, seed=3, global_batch=8)
    reports = StepReports(config, Group(choose_device(), environ={}), reporter, sampler,
                          reports_samples=True)
    healed = sampler.assign(0, 2)
    sampler.commit(healed)
    reports.committed(StepResult(True, 0.0, healed, np.empty(0, dtype=np.int64), False,
                                 took_part=False), 1, 8, 0, 1e-3)
    trained = sampler.assign(0, 2)
    sampler.commit(trained)
    reports.committed(StepResult(True, 0.7, trained, trained.indices, False), 2, 16, 0, 1e-3)
    reports.outlived()
    reporter.close()

    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["kind"], r["data"]["step"]) for r in written] == [
        ("samples", 1), ("metric", 2), ("samples", 2)]
    first, second = written[0]["data"], written[2]["data"]
    assert first["ids"] == [] and first["window"] == sampler.order(0)[0:8].tolist()
    assert second["ids"] == trained.indices.tolist()
    assert second["window"] == sampler.order(0)[8:16].tolist()
