"""A job spec's checks that need the machine: do its model and dataset exist where it says,
can the model train it (its config.json read, not the model loaded), can the backend quantize;
and which hub repositories it names, to stage before its pods start (api.services.staging).
Each failure is a 422 naming the field (api.errors.InvalidSpec)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from api.errors import InvalidSpec
from api.models import JobCreate
from trainer.contract.datasets import DATA_FILE, dataset_dir, is_dataset_id
from trainer.contract.model_facts import (
    ModelFactsError,
    offline_model_dir,
    read_facts,
    spec_problems,
)
from trainer.contract.spec import (
    DATASET_ALIASES,
    HUB_SOURCES,
    LOCAL_DATA_SUFFIXES,
    OFFLINE_MODEL,
    JobSpec,
)
from trainer.contract.staged import Kind, staged

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def _inside_inputs(field: str, value: str, inputs: Path) -> Path | None:
    """The local path `value` names under the inputs dir, None if nothing is there."""
    if Path(value).is_absolute():
        raise InvalidSpec(field, "give a path relative to the inputs dir, not an absolute path")
    # Lexical check: ".." cannot climb out; symlinks the operator put in the inputs dir may.
    candidate = Path(os.path.normpath(inputs / value))
    if not candidate.is_relative_to(inputs):
        raise InvalidSpec(field, "path escapes the inputs dir")
    return candidate if candidate.exists() else None


def validate_sources(spec: JobCreate, inputs: Path) -> None:
    """Local path under the inputs dir first, then aliases, then hub ids (models only)."""
    model = _inside_inputs("model", spec.model, inputs)
    if model is not None and not (model / "config.json").is_file():
        raise InvalidSpec("model", f"'{spec.model}' under the inputs dir has no config.json")
    readable = model if model is not None else (
        offline_model_dir() if spec.model == OFFLINE_MODEL else hub_model(spec, inputs))
    if readable is not None:
        check_against_model(spec, readable)
    if model is None and spec.model != OFFLINE_MODEL and (
            not HUB_ID.match(spec.model) or ".." in spec.model):
        raise InvalidSpec("model", f"'{spec.model}' is neither a model directory under the "
                                   f"inputs dir, nor '{OFFLINE_MODEL}', nor a Hugging Face hub id")
    if is_dataset_id(spec.dataset):
        if not (dataset_dir(inputs, spec.dataset) / DATA_FILE).is_file():
            raise InvalidSpec("dataset", f"no dataset '{spec.dataset}': upload one with POST "
                                         "/api/v1/datasets, or list them with GET")
        return
    dataset = _inside_inputs("dataset", spec.dataset, inputs)
    if dataset is not None:
        if not dataset.is_file() or dataset.suffix.lower() not in LOCAL_DATA_SUFFIXES:
            raise InvalidSpec("dataset", f"'{spec.dataset}' must be a "
                                         f"{'/'.join(LOCAL_DATA_SUFFIXES)} file")
    elif spec.dataset not in DATASET_ALIASES:
        raise InvalidSpec("dataset", f"unknown dataset '{spec.dataset}': use one of "
                                     f"{', '.join(DATASET_ALIASES)} or a file under the inputs dir")


def hub_model(spec: JobSpec, inputs: Path) -> Path | None:
    """The staged copy of the hub model the spec names, if it names one and it is staged."""
    return (staged(inputs, "model", spec.model, spec.model_revision)
            if HUB_ID.match(spec.model) else None)


def hub_repositories(spec: JobSpec, inputs: Path) -> list[tuple[Kind, str, str]]:
    """The hub repositories a valid spec names, each at its revision: its model unless it is a
    local directory or the offline alias, its dataset if it is a hub alias."""
    named: list[tuple[Kind, str, str]] = []
    if spec.model != OFFLINE_MODEL and not Path(spec.model).is_absolute() and not (
            inputs / spec.model).exists() and HUB_ID.match(spec.model):
        named.append(("model", spec.model, spec.model_revision))
    if spec.dataset in HUB_SOURCES:
        named.append(("dataset", HUB_SOURCES[spec.dataset][0], spec.dataset_revision))
    return named


def check_against_model(spec: JobSpec, directory: Path) -> None:
    """The spec's parts that the model in `directory` cannot train: a 422 on the first."""
    try:
        facts = read_facts(directory)
    except ModelFactsError as exc:
        raise InvalidSpec("model", f"'{spec.model}': {exc}") from None
    problems = spec_problems(spec, facts)
    if problems:
        raise InvalidSpec(*problems[0])


def check_quantization(spec: JobCreate, backend: str) -> None:
    """An 8-bit base model needs a CUDA GPU and bitsandbytes in its pods: on the local backend
    this machine's, on Kubernetes a GPU per pod (the trainer image has bitsandbytes)."""
    if spec.quantization == "none":
        return
    if backend == "local":
        import importlib.util

        import torch

        if not torch.cuda.is_available():
            raise InvalidSpec("quantization", "an 8-bit base model needs CUDA and bitsandbytes: "
                                              "the local backend's machine has no CUDA GPU")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise InvalidSpec("quantization", "an 8-bit base model needs bitsandbytes: "
                                              "pip install bitsandbytes")
    elif not (spec.resources and spec.resources.gpus):
        raise InvalidSpec("quantization", "an 8-bit base model needs CUDA and bitsandbytes: "
                                          "ask for a GPU per pod (resources.gpus)")
