import json
import sys
from pathlib import Path

import pytest

from trainer.config import ConfigError, JobSpec, load_config
from trainer.contract.process import ExitCode
from trainer.main import main


def test_defaults_match_the_job_spec_contract() -> None:
    # Field for field, so a new field needs no edit here; the offline demo's model and data.
    spec = load_config([], {}).spec
    assert spec == JobSpec()
    assert (spec.model, spec.dataset) == ("minilm", "rotten_tomatoes")


def test_precedence_is_cli_over_file_over_env(tmp_path: Path) -> None:
    env = {"TRAINER_CONFIG": json.dumps({"epochs": 3, "batch_size": 4, "seed": 7}),
           "CHECKPOINT_DIR": "/env/ckpt", "JOB_ID": "job-42"}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"batch_size": 8, "seed": 9,
                                     "runtime": {"checkpoint_dir": "/file/ckpt"}}))
    config = load_config(["--config", str(spec_file), "--seed", "11"], env)
    assert config.spec.epochs == 3
    assert config.spec.batch_size == 8
    assert config.spec.seed == 11
    assert config.runtime.checkpoint_dir == Path("/file/ckpt")
    assert config.runtime.job_id == "job-42"


def test_a_flag_sets_an_optional_back_to_none() -> None:
    env = {"TRAINER_CONFIG": json.dumps({"max_train_samples": 100}), "MAX_STEPS": "5"}
    config = load_config(["--max-train-samples", "null", "--max-steps", "null"], env)
    assert config.spec.max_train_samples is None
    assert config.runtime.max_steps is None


def test_without_argv_the_process_arguments_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["trainer", "--seed", "5", "--job-id", "job-7"])
    config = load_config(None, {})
    assert (config.spec.seed, config.runtime.job_id) == (5, "job-7")


def test_env_types_are_coerced() -> None:
    config = load_config([], {"LOG_SAMPLE_IDS": "true", "MAX_STEPS": "12",
                              "TRAINER_CONFIG": '{"max_train_samples": null}'})
    assert config.runtime.log_sample_ids is True
    assert config.runtime.max_steps == 12
    assert config.spec.max_train_samples is None


@pytest.mark.parametrize(("document", "field"), [
    ({"epochz": 3}, "epochz"),
    ({"epochs": 0}, "epochs"),
    ({"epochs": 1.5}, "epochs"),
    ({"batch_size": "many"}, "batch_size"),
    ({"learning_rate": 2.0}, "learning_rate"),
    ({"fault_tolerance": "magic"}, "fault_tolerance"),
    ({"max_length": 4096}, "max_length"),
    ({"parallelism": "pipeline", "torch_compile": True}, "torch_compile"),
    ({"model": None}, "model"),
    ({"runtime": {"max_steps": 0}}, "max_steps"),
    ({"runtime": {"report_url": "http://x/reports"}}, "report_token"),
])
def test_bad_values_name_the_field(document: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config([], {"TRAINER_CONFIG": json.dumps(document)})


def test_unreadable_spec_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(["--config", str(tmp_path / "missing.json")], {})
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config([], {"TRAINER_CONFIG": "{epochs: 3"})


@pytest.mark.parametrize(("argv", "named"), [
    (["--epochz", "3"], "--epochz"),
    (["--seed"], "--seed"),
    (["--batch", "8"], "--batch"),  # no abbreviations: a new flag could make one ambiguous
    (["--resources", "{}"], "--resources"),
])
def test_bad_flags_name_the_flag(argv: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(argv, {})


def test_main_exits_2_with_the_field_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--batch-size", "-1"], environ={}) == ExitCode.BAD_INPUT
    assert "batch_size" in capsys.readouterr().err


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    # A description with a % sign (the dataset's "25% sample") once crashed argparse here.
    with pytest.raises(SystemExit) as exited:
        load_config(["--help"], {})
    assert exited.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # as wrapped at any terminal width
    assert "--dataset" in shown and "25% sample" in shown and "--finetune" in shown
    assert "--batch-size" in shown and "(default: 16)" in shown
    assert "[env: CHECKPOINT_DIR]" in shown and "--config" in shown
