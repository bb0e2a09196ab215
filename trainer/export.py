"""Export of the trained model: save_pretrained of the bare model, tokenizer, metrics and a card."""

from __future__ import annotations

import json
import logging
import tempfile
import uuid
from pathlib import Path
from typing import Any

from torch import nn
from upath import UPath

from trainer.contract.artifact_store import move, remove, upload
from trainer.contract.checkpoints import (
    ADAPTER_DIR,
    EXPORTED,
    METRICS_FILE,
    export_staging,
    remove_export_staging,
)
from trainer.contract.spec import JobSpec
from trainer.model import model_labels, unwrap

logger = logging.getLogger(__name__)


def _percent(value: Any) -> str:
    return f"{100 * value:.2f}%" if isinstance(value, int | float) else "n/a"


def model_card(spec: JobSpec, metrics: dict[str, Any], data: dict[str, int],
               labels: tuple[str, ...]) -> str:
    test = metrics.get("test", {})
    validation = metrics.get("validation", {})
    settings = "\n".join(f"| {key} | {value} |" for key, value in (
        ("epochs", spec.epochs), ("batch size per replica", spec.batch_size),
        ("learning rate", spec.learning_rate), ("max length", spec.max_length),
        ("replicas", spec.replicas), ("fault tolerance", spec.fault_tolerance),
        ("fine-tuning", spec.finetune), ("seed", spec.seed),
        *((("LoRA", f"r {spec.lora.r}, alpha {spec.lora.alpha}, dropout {spec.lora.dropout}, "
                    f"on {', '.join(spec.lora.target_modules)}"),) if spec.finetune == "lora"
          else ())))
    lora = ("""
These weights are the base model with the LoRA adapters merged in: an ordinary model. The
adapters alone are in `adapter/` (`GET /api/v1/models/{id}/download?format=adapter`), for
`peft.PeftModel.from_pretrained(base_model, "adapter")`.
""" if spec.finetune == "lora" else "")
    return f"""---
library_name: transformers
pipeline_tag: text-classification
tags: [sentiment-analysis, live-migrator]
base_model: {spec.model}
datasets: [{spec.dataset}]
metrics: [accuracy, f1]
---

# {spec.name or "Sentiment classifier"}

Text classifier (labels {", ".join(f"`{name}`" for name in labels)}) fine-tuned from
`{spec.model}` on
`{spec.dataset}`{f" with the `{spec.preset}` preset" if spec.preset else ""} by Live Migrator.
{lora}
## Results

| split | samples | accuracy | F1 | loss |
|---|---|---|---|---|
| test | {data.get("test", 0)} | {_percent(test.get("accuracy"))} | {_percent(test.get("f1"))} \
| {test.get("loss", float("nan")):.4f} |
| validation | {data.get("validation", 0)} | {_percent(validation.get("accuracy"))} \
| {_percent(validation.get("f1"))} | {validation.get("loss", float("nan")):.4f} |

Trained on {data.get("train", 0)} samples.

## Training settings

| setting | value |
|---|---|
{settings}

## Use

```python
from transformers import pipeline
classify = pipeline("text-classification", model="path/to/this/directory")
classify("A warm, funny and beautifully acted film.")
```
"""


def export_model(model: nn.Module, tokenizer: Any, target: Path | UPath, spec: JobSpec,
                 metrics: dict[str, Any], data: dict[str, int], shared: bool = False,
                 adapter: nn.Module | None = None) -> Path | UPath:
    """Write the export next to `target`, then swap it in, so readers never see half of it.

    `target` may be in an object store (trainer.contract.artifact_store): the export is saved
    locally, uploaded next to it, and moved in with `config.json`, what readers wait for, last.
    `shared`: other replicas holding the same weights may export at the same time; the first
    one in place stays and the others are discarded. `adapter`: a LoRA model, whose adapters
    are saved alone in `adapter/` beside the merged `model`.
    """
    if not shared:
        # A lone exporter: no other export can be under way, while live peers may be staging
        # theirs right now (the control plane clears theirs once the job's workload is gone).
        remove_export_staging(target)
    staging = target.with_name(f"{export_staging(target)}{uuid.uuid4().hex[:12]}")
    if isinstance(staging, Path):
        _save(model, tokenizer, staging, spec, metrics, data, adapter)
    else:
        with tempfile.TemporaryDirectory(prefix="export-") as scratch:
            _save(model, tokenizer, Path(scratch), spec, metrics, data, adapter)
            upload(Path(scratch), staging)
    if shared and (target / EXPORTED).is_file():
        remove(staging)
        logger.info("model already exported to %s by a peer", target)
        return target
    if target.exists() and not shared:
        remove(target, first=EXPORTED)
    try:
        move(staging, target, last=EXPORTED)
    except OSError:
        if not (shared and target.is_dir()):
            raise
        remove(staging)
        logger.info("model already exported to %s by a peer", target)
        return target
    logger.info("model exported to %s", target)
    return target


def exported_metrics(target: Path | UPath, step: int) -> dict[str, Any] | None:
    """The metrics saved with the whole export at `target` if it holds the model of `step`
    (its test evaluation's step), else None."""
    if not (target / EXPORTED).is_file():
        return None
    try:
        metrics = json.loads((target / METRICS_FILE).read_text())["metrics"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    test = metrics.get("test") if isinstance(metrics, dict) else None
    return metrics if isinstance(test, dict) and test.get("step") == step else None


def _save(model: nn.Module, tokenizer: Any, directory: Path, spec: JobSpec,
          metrics: dict[str, Any], data: dict[str, int], adapter: nn.Module | None) -> None:
    whole = unwrap(model)
    # transformers writes the weights and config only on global rank 0 where torch.distributed
    # is initialised; the pod that exports need not be that rank (a pipeline's primary, after a
    # restart's rendezvous), and it is the one that saves.
    whole.__dict__["should_save_on_this_rank"] = lambda is_main_process: is_main_process
    try:
        whole.save_pretrained(directory)  # type: ignore[operator]
    finally:
        del whole.__dict__["should_save_on_this_rank"]
    if adapter is not None:
        adapter.save_pretrained(directory / ADAPTER_DIR)  # type: ignore[operator]
    tokenizer.save_pretrained(directory)
    (directory / METRICS_FILE).write_text(json.dumps(
        {"metrics": metrics, "samples": data, "spec": spec.model_dump(mode="json")}, indent=2))
    (directory / "README.md").write_text(model_card(spec, metrics, data, model_labels(model)))
