import json
from pathlib import Path

import pytest

from trainer.config import ConfigError, load_config
from trainer.contract.process import ExitCode
from trainer.main import main


def test_defaults_match_the_job_spec_contract() -> None:
    config = load_config([], {})
    spec = config.spec
    assert (spec.model, spec.dataset, spec.replicas, spec.epochs, spec.batch_size) == (
        "minilm", "rotten_tomatoes", 2, 1, 16)
    assert (spec.learning_rate, spec.max_length, spec.fault_tolerance, spec.parallelism,
            spec.finetune, spec.checkpoint_every_steps, spec.seed) == (
        1e-4, 128, "live", "data", "full", 50, 42)


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


def test_main_exits_2_with_the_field_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--batch-size", "-1"], environ={}) == ExitCode.BAD_INPUT
    assert "batch_size" in capsys.readouterr().err


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    # A description with a % sign (the dataset's "25% sample") once crashed argparse here.
    with pytest.raises(SystemExit) as exited:
        load_config(["--help"], {})
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "--dataset" in shown and "25% sample" in shown and "--finetune" in shown
