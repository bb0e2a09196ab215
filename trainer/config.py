"""Trainer configuration: the job spec (trainer.contract.spec) and this pod's runtime
(trainer.contract.runtime), validated once by their pydantic models.

Precedence, lowest first: defaults, the environment (TRAINER_CONFIG holds the spec as JSON; the
runtime has a variable per field), a JSON file given with --config, command-line flags. A
document is a flat job spec with an optional `runtime` object.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainer.contract.runtime import SPEC_ENV, Runtime
from trainer.contract.spec import JobSpec

CLI_SECTIONS: tuple[type[BaseModel], ...] = (JobSpec, Runtime)
NOT_ON_THE_COMMAND_LINE = {"resources", "lora"}
"""Nested objects: a document sets them; no pod needs them as a flag."""


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


@dataclass
class TrainConfig:
    """Everything one trainer process needs."""

    spec: JobSpec = field(default_factory=JobSpec)
    runtime: Runtime = field(default_factory=Runtime)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Fine-tune a BERT-family sentiment classifier (one pod of a job).")
    parser.add_argument("--config", type=Path, help="JSON job spec (overrides TRAINER_CONFIG)")
    for section in CLI_SECTIONS:
        group = parser.add_argument_group(section.__name__)
        for name, info in section.model_fields.items():
            if name not in NOT_ON_THE_COMMAND_LINE:
                # Values stay strings: the models convert them, as they do the environment's.
                # argparse formats help with %: a description's own % signs are escaped.
                group.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                                   metavar="VALUE",
                                   help=(info.description or "").replace("%", "%%"))
    return parser


def _read_json(text: str, origin: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{origin}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a JSON object")
    return data


def _merge(spec: dict[str, Any], runtime: dict[str, Any], document: dict[str, Any],
           origin: str) -> None:
    document = dict(document)
    nested = document.pop("runtime", None)
    if nested is not None and not isinstance(nested, dict):
        raise ConfigError(f"runtime: expected an object in {origin}")
    spec.update(document)
    runtime.update(nested or {})


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


def load_config(argv: Sequence[str] | None, environ: Mapping[str, str]) -> TrainConfig:
    """Build and validate the configuration from environment, file and command line."""
    args = build_parser().parse_args(argv)
    spec: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    if environ.get(SPEC_ENV):
        _merge(spec, runtime, _read_json(environ[SPEC_ENV], SPEC_ENV), SPEC_ENV)
    runtime.update(Runtime.fields_from_env(environ))
    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as exc:
            raise ConfigError(f"--config: cannot read {args.config}: {exc.strerror}") from None
        _merge(spec, runtime, _read_json(text, str(args.config)), str(args.config))
    for name, value in vars(args).items():
        if name != "config" and value is not None:
            (spec if name in JobSpec.model_fields else runtime)[name] = value
    try:
        return TrainConfig(JobSpec.model_validate(spec), Runtime.model_validate(runtime))
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


__all__ = ["ConfigError", "JobSpec", "Runtime", "TrainConfig", "load_config"]
