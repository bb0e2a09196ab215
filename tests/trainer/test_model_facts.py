import json
from pathlib import Path

import pytest

from trainer.contract.model_facts import (
    ModelFactsError,
    offline_model_dir,
    read_facts,
    spec_problems,
)
from trainer.contract.spec import JobSpec


def config(tmp_path: Path, **values: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(values))
    return tmp_path


def test_roberta_keeps_two_positions_and_distilbert_has_modules_of_its_own(
        tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    roberta = read_facts(config(tmp_path / "r", model_type="roberta", num_hidden_layers=12,
                                max_position_embeddings=514))
    assert (roberta.layers, roberta.positions) == (12, 512)
    (tmp_path / "d").mkdir()
    distil = read_facts(config(tmp_path / "d", model_type="distilbert", n_layers=6,
                               max_position_embeddings=512))
    assert distil.layers == 6
    lora = JobSpec(finetune="lora")  # query and value: BERT's names
    assert [field for field, _ in spec_problems(lora, distil)] == ["lora"]
    distil_lora = JobSpec(model="distil", finetune="lora", lora={"target_modules": ["q_lin"]})
    assert spec_problems(distil_lora, distil) == []


def test_an_unknown_type_is_left_to_the_trainer_and_a_bad_config_says_why(
        tmp_path: Path) -> None:
    facts = read_facts(config(tmp_path, model_type="llama"))
    assert (facts.layers, facts.positions, facts.modules) == (None, None, None)
    llama_lora = JobSpec(model="llama", finetune="lora", lora={"target_modules": ["q_proj"]})
    assert spec_problems(llama_lora, facts) == []
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelFactsError, match="not a JSON object"):
        read_facts(tmp_path)


def test_the_offline_model_is_found_without_importing_it() -> None:
    directory = offline_model_dir()
    assert directory is not None
    facts = read_facts(directory)
    assert (facts.model_type, facts.layers, facts.positions) == ("bert", 6, 512)
