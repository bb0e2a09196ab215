"""Trainer configuration: the job spec (trainer.contract.spec) and this pod's runtime
(trainer.contract.runtime), validated once by their pydantic models.

Precedence, lowest first: defaults, the environment (TRAINER_CONFIG holds the spec as JSON; the
runtime has a variable per field), a JSON file given with --config, command-line flags. A
document is a flat job spec with an optional `runtime` object. The flags (`--batch-size`, one per
field of both models) are pydantic-settings' CLI source over those fields; like the
environment's, their values are checked only when everything is merged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, CliSettingsSource, SettingsConfigDict, SettingsError

from trainer.contract.runtime import SPEC_ENV, Runtime
from trainer.contract.spec import JobSpec

NOT_ON_THE_COMMAND_LINE = {"resources", "lora"}
"""Nested objects: a document sets them; no pod needs them as a flag."""


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


@dataclass
class TrainConfig:
    """Everything one trainer process needs."""

    spec: JobSpec = field(default_factory=JobSpec)
    runtime: Runtime = field(default_factory=Runtime)


class _CommandLine(BaseSettings):
    """Fine-tune a BERT-family sentiment classifier (one pod of a job)."""

    model_config = SettingsConfigDict(cli_prog_name="python -m trainer", cli_kebab_case=True,
                                      cli_exit_on_error=False)

    config: Path | None = Field(default=None,
                                description=f"JSON job spec (overrides {SPEC_ENV})")


def _flag(section: type[BaseModel], name: str) -> Any:
    """A field of `section` as a flag: its type (for the parser and --help), default and docs;
    none of its checks (the section's model runs them, once every source is merged)."""
    info = section.model_fields[name]
    help_ = info.description or ""
    if section is Runtime:
        help_ += f" [env: {Runtime.env_name(name)}]"
    return (info.annotation,
            Field(default=info.get_default(call_default_factory=True), description=help_))


COMMAND_LINE: type[BaseSettings] = create_model(
    "CommandLine", __base__=_CommandLine, __doc__=_CommandLine.__doc__,
    **{name: _flag(section, name) for section in (JobSpec, Runtime)
       for name in section.model_fields if name not in NOT_ON_THE_COMMAND_LINE})
"""The trainer's flags: `--config` and one per field of the job spec and the runtime."""


def parse_command_line(argv: Sequence[str]) -> dict[str, Any]:
    """The values the flags set (strings, as the environment's are), by field name."""
    try:
        return CliSettingsSource(COMMAND_LINE)(args=list(argv))()
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None


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
    """Build and validate the configuration from environment, file and command line (argv
    None: this process's)."""
    flags = parse_command_line(sys.argv[1:] if argv is None else argv)
    config_file = flags.pop("config", None)
    spec: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    if environ.get(SPEC_ENV):
        _merge(spec, runtime, _read_json(environ[SPEC_ENV], SPEC_ENV), SPEC_ENV)
    runtime.update(Runtime.fields_from_env(environ))
    if config_file is not None:
        try:
            text = Path(config_file).read_text()
        except OSError as exc:
            raise ConfigError(f"--config: cannot read {config_file}: {exc.strerror}") from None
        _merge(spec, runtime, _read_json(text, config_file), config_file)
    for name, value in flags.items():
        (spec if name in JobSpec.model_fields else runtime)[name] = value
    try:
        return TrainConfig(JobSpec.model_validate(spec), Runtime.model_validate(runtime))
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


__all__ = ["ConfigError", "JobSpec", "Runtime", "TrainConfig", "load_config"]
