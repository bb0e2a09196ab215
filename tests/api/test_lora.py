"""LoRA jobs on the whole product: real pods of the local backend; a pod killed mid-epoch
heals only the trainable state from its peer, and the replicas end identical."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.control_plane import ControlPlane
from tests.api.scenarios import (
    Job,
    assert_exactly_once,
    assert_identical_replicas,
    assert_no_step_computed_twice,
    spec,
)
from tests.support import wait_for

pytestmark = pytest.mark.slow


def test_a_killed_lora_pod_heals_just_the_adapters_and_the_head(plane: ControlPlane) -> None:
    from transformers import AutoModelForSequenceClassification

    job = Job(plane, spec("live", replicas=2, finetune="lora", learning_rate=0.03, epochs=10))
    job.wait_steps(3, 0.0, 2, (0, 1), "both pods to train")
    killed_at = job.kill(1)
    job.wait_steps(2, killed_at, 1, (0,), "pod 0 to train on alone")
    healed = wait_for(lambda: [r for r in job.reports("healed", killed_at)
                               if r["target"] == job.pod(1)], timeout=120,
                      what="pod 1 to heal from pod 0")
    job.wait_steps(2, killed_at, 2, (0, 1), "both pods to train together again")
    finished = job.finish()
    assert_exactly_once(job)
    assert_no_step_computed_twice(job)
    assert_identical_replicas(job, pods=2)

    # The heal carried the adapters, the head and the trainer's state: a few percent of what
    # the whole model's weights alone would have been.
    model_dir = Path(next(r["model_dir"] for r in job.reports("completed") if r["model_dir"]))
    merged = AutoModelForSequenceClassification.from_pretrained(model_dir)
    whole = sum(v.numel() * v.element_size() for v in merged.state_dict().values())
    assert 0 < healed[0]["bytes"] < whole / 5
    assert (model_dir / "adapter" / "adapter_config.json").is_file()
    assert finished["metrics"]["test_accuracy"] >= 0.8
    metrics = finished["metrics"]
    assert 0 < metrics["trainable_parameters"] < metrics["parameters"] / 10  # the job page's
