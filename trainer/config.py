"""Trainer configuration: what the job asked for (JobSpec) and where this pod runs (Runtime).

Precedence, lowest first: field defaults, environment (TRAINER_CONFIG and the runtime variables),
a JSON file given with --config, command-line flags. Validation happens once, in `validate()`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


FaultTolerance = Literal["live", "restart"]
Parallelism = Literal["data", "pipeline"]
Finetune = Literal["full", "lora"]
Preset = Literal["seed"]


@dataclass
class JobSpec:
    """The user's job spec: the same keys as the body of `POST /api/v1/jobs`."""

    name: str | None = None
    """Display name of the job (free text)."""

    model: str = "minilm"
    """Hugging Face hub id, a local model directory, or the offline alias `minilm`."""

    dataset: str = "rotten_tomatoes"
    """`rotten_tomatoes` (offline), `imdb`, `sst2`, `yelp_polarity`, or a CSV/JSONL/Parquet file."""

    preset: Preset | None = None
    """`seed`: 80/20 train/test split, a 25% sample of each, 20% of train kept for validation."""

    max_train_samples: int | None = None
    """Cap on training samples after the split (a seeded random subset); None keeps all."""

    max_eval_samples: int | None = None
    """Cap on validation and on test samples each; None keeps all."""

    replicas: int = 2
    """Number of pods the job asks for (data-parallel replicas or pipeline stages)."""

    epochs: int = 1
    """Passes over the training split."""

    batch_size: int = 16
    """Samples per participant per step; a step consumes `batch_size` x participants samples."""

    learning_rate: float = 1e-4
    """Peak AdamW learning rate, reached after warm-up and decayed linearly to zero."""

    max_length: int = 128
    """Longest tokenized input; longer texts are truncated."""

    fault_tolerance: FaultTolerance = "live"
    """`live`: survivors train on through a failure; `restart`: all restart from a checkpoint."""

    parallelism: Parallelism = "data"
    """`data`: every pod holds the whole model; `pipeline`: one model stage per pod."""

    finetune: Finetune = "full"
    """`full`: train every weight; `lora`: low-rank adapters on query/value."""

    checkpoint_every_steps: int = 50
    """Write a step checkpoint every N committed steps (0: only at epoch ends)."""

    seed: int = 42
    """Seed for the data split, the per-epoch sample order, initialisation and dropout."""

    warmup_ratio: float = 0.1
    """Fraction of all steps spent warming the learning rate up from zero."""

    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""

    max_grad_norm: float = 1.0
    """Gradients are clipped to this global L2 norm (0 disables clipping)."""

    validation_fraction: float = 0.2
    """Share of the training split held out for validation when the source has none."""

    eval_batch_size: int = 64
    """Samples per participant per evaluation batch."""

    keep_checkpoints: int = 3
    """Complete checkpoints kept besides the best one by validation accuracy."""

    text_column: str = "text"
    """Column holding the text in local dataset files."""

    label_column: str = "label"
    """Column holding the label (0/1, or two distinct strings) in local dataset files."""


@dataclass
class Runtime:
    """Where this pod runs; set by the backend through the environment (names in `ENV_NAMES`)."""

    job_id: str = "local"
    """Job id, carried in every log line and report."""

    pod_name: str = ""
    """This pod's stable name, `<job>-<ordinal>`; defaults to `<job_id>-<rank>`."""

    incarnation: str = ""
    """Identifies this process's life of the pod (restart count or uid); generated if empty."""

    report_url: str | None = None
    """Where reports are POSTed (`.../api/v1/jobs/{id}/reports`); None disables HTTP reporting."""

    report_token: str | None = None
    """Bearer token for `report_url` (the per-job report token)."""

    metrics_file: Path | None = None
    """Optional JSON-lines file that receives every report record too."""

    checkpoint_dir: Path = Path("runs/checkpoints")
    """Shared directory of this job's checkpoints (`step-N/`)."""

    model_dir: Path = Path("runs/model")
    """Where the primary exports the trained model with `save_pretrained`."""

    inputs_dir: Path = Path("data/inputs")
    """Root for local models and datasets named by a relative path."""

    cache_dir: Path = Path("data/cache")
    """Tokenization cache, keyed by dataset, tokenizer and max_length."""

    log_sample_ids: bool = False
    """Debug: report the sample ids every committed step consumed (proves exactly-once use)."""

    max_steps: int | None = None
    """Stop after this many committed steps in all (benchmarks, tests); None runs every epoch."""

    heartbeat_file: Path | None = None
    """Touched (about once a second) while report records flow; Kubernetes probes its age."""


ENV_NAMES: dict[str, str] = {
    "job_id": "JOB_ID",
    "pod_name": "POD_NAME",
    "incarnation": "POD_INCARNATION",
    "report_url": "REPORT_URL",
    "report_token": "REPORT_TOKEN",
    "metrics_file": "METRICS_FILE",
    "checkpoint_dir": "CHECKPOINT_DIR",
    "model_dir": "MODEL_DIR",
    "inputs_dir": "INPUTS_DIR",
    "cache_dir": "TRAINER_CACHE_DIR",
    "log_sample_ids": "LOG_SAMPLE_IDS",
    "max_steps": "MAX_STEPS",
    "heartbeat_file": "HEARTBEAT_FILE",
}


@dataclass
class TrainConfig:
    """Everything one trainer process needs."""

    spec: JobSpec = field(default_factory=JobSpec)
    runtime: Runtime = field(default_factory=Runtime)


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(section: type, name: str, value: Any) -> Any:
    """Convert a JSON, env or CLI value to the field's type; raise ConfigError naming the field."""
    hint = _field_types(section)[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    if value is None or (optional and isinstance(value, str) and value.lower() in ("", "none")):
        if optional:
            return None
        raise ConfigError(f"{name}: must not be null")
    base = next((a for a in args if a is not type(None)), hint) if optional else hint
    if typing.get_origin(base) is Literal:
        allowed = typing.get_args(base)
        if value not in allowed:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(str, allowed))}")
        return value
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false",
                                                            "no", "off"):
                return value.lower() in ("1", "true", "yes", "on")
            raise ValueError(value)
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if base is Path:
            return Path(value)
        if base is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
    except (TypeError, ValueError):
        kind = getattr(base, "__name__", base)
        raise ConfigError(f"{name}: {value!r} is not a valid {kind}") from None
    raise ConfigError(f"{name}: unsupported type {hint}")  # pragma: no cover - a coding error


def _apply(target: Any, values: Mapping[str, Any], origin: str) -> None:
    names = {f.name for f in dataclasses.fields(target)}
    for key, value in values.items():
        if key not in names:
            raise ConfigError(f"{key}: unknown field in {origin}")
        setattr(target, key, _coerce(type(target), key, value))


def _read_json(text: str, origin: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{origin}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a JSON object")
    return data


def _apply_document(config: TrainConfig, data: Mapping[str, Any], origin: str) -> None:
    """A document is a flat job spec; an optional `runtime` object sets runtime fields."""
    data = dict(data)
    runtime = data.pop("runtime", None)
    _apply(config.spec, data, origin)
    if runtime is not None:
        if not isinstance(runtime, dict):
            raise ConfigError(f"runtime: expected an object in {origin}")
        _apply(config.runtime, runtime, origin)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Fine-tune a BERT-family sentiment classifier (one pod of a job).",
    )
    parser.add_argument("--config", type=Path, help="JSON job spec (overrides TRAINER_CONFIG)")
    for section in (JobSpec, Runtime):
        group = parser.add_argument_group(section.__name__)
        for f in dataclasses.fields(section):
            group.add_argument(_flag(f.name), dest=f.name, default=None, metavar="VALUE",
                               help=_field_doc(section, f.name))
    return parser


def _field_doc(section: type, name: str) -> str:
    """The docstring written under a field, for --help."""
    tree = ast.parse(inspect.getsource(section))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == name and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)):
            return str(following.value.value)
    return ""


def load_config(argv: Sequence[str] | None, environ: Mapping[str, str]) -> TrainConfig:
    """Build and validate the configuration from environment, file and command line."""
    args = build_parser().parse_args(argv)
    config = TrainConfig()
    if environ.get("TRAINER_CONFIG"):
        _apply_document(config, _read_json(environ["TRAINER_CONFIG"], "TRAINER_CONFIG"),
                        "TRAINER_CONFIG")
    from_env = {name: environ[env] for name, env in ENV_NAMES.items() if env in environ}
    _apply(config.runtime, from_env, "environment")
    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as exc:
            raise ConfigError(f"--config: cannot read {args.config}: {exc.strerror}") from None
        _apply_document(config, _read_json(text, str(args.config)), str(args.config))
    cli = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    spec_names = {f.name for f in dataclasses.fields(JobSpec)}
    _apply(config.spec, {k: v for k, v in cli.items() if k in spec_names}, "command line")
    _apply(config.runtime, {k: v for k, v in cli.items() if k not in spec_names}, "command line")
    validate(config)
    return config


def validate(config: TrainConfig) -> None:
    """Check ranges once, after every source has been applied."""
    spec = config.spec
    positive = ("replicas", "epochs", "batch_size", "max_length", "eval_batch_size",
                "keep_checkpoints")
    for name in positive:
        if getattr(spec, name) < 1:
            raise ConfigError(f"{name}: must be at least 1, got {getattr(spec, name)}")
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(spec, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name}: must be at least 1 when given, got {value}")
    if spec.max_length > 512:
        raise ConfigError(f"max_length: BERT-family models take at most 512 tokens, got "
                          f"{spec.max_length}")
    if not 0 < spec.learning_rate < 1:
        raise ConfigError(f"learning_rate: must be in (0, 1), got {spec.learning_rate}")
    if spec.checkpoint_every_steps < 0:
        raise ConfigError("checkpoint_every_steps: must be 0 (off) or positive")
    for name in ("warmup_ratio", "validation_fraction"):
        if not 0 <= getattr(spec, name) < 1:
            raise ConfigError(f"{name}: must be in [0, 1), got {getattr(spec, name)}")
    if spec.weight_decay < 0 or spec.max_grad_norm < 0:
        raise ConfigError("weight_decay and max_grad_norm: must not be negative")
    if not spec.model.strip():
        raise ConfigError("model: must not be empty")
    if not spec.dataset.strip():
        raise ConfigError("dataset: must not be empty")
    if spec.parallelism != "data":
        raise ConfigError("parallelism: only 'data' is implemented by this trainer version")
    if spec.finetune != "full":
        raise ConfigError("finetune: only 'full' is implemented by this trainer version")
    if config.runtime.max_steps is not None and config.runtime.max_steps < 1:
        raise ConfigError("max_steps: must be at least 1 when given")
    if config.runtime.report_url and not config.runtime.report_token:
        raise ConfigError("report_token: required when report_url is set (REPORT_TOKEN)")


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


__all__ = ["ConfigError", "JobSpec", "Runtime", "TrainConfig", "load_config", "spec_to_dict"]
