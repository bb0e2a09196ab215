"""The generated files (api/docs.py) match the code: the reference pages its field docstrings,
web/static/contract.js its contract names."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from api import docs
from api.settings import Settings
from tests.conftest import ROOT
from trainer.contract.spec import JobSpec

REGENERATE = f"run `.venv/bin/{docs.COMMAND}` and commit the result"


@pytest.mark.parametrize("path", sorted(docs.pages()), ids=str)
def test_the_checked_in_page_is_what_the_code_generates(path: Path) -> None:
    expected = docs.pages()[path]
    target = ROOT / path
    assert target.is_file(), f"{path} is missing: {REGENERATE}"
    assert target.read_text() == expected, f"{path} is out of date: {REGENERATE}"


@pytest.mark.parametrize("model", [JobSpec, Settings])
def test_every_field_has_a_docstring(model: type[BaseModel]) -> None:
    assert docs.undocumented(model) == [], "document these fields where they are declared"


def test_every_field_of_the_spec_and_its_nested_models_gets_a_row() -> None:
    page = docs.job_spec_page()
    for model in (JobSpec, *docs.nested_models(JobSpec.model_fields["resources"].annotation),
                  *docs.nested_models(JobSpec.model_fields["lora"].annotation)):
        assert f"## {model.__name__}" in page
        for name in model.model_fields:
            assert f"| `{name}` |" in page
    assert "| `resources` | [PodResources](#podresources) \\| `null` | `null` |" in page


def test_a_settings_row_names_the_variable_its_type_default_and_docstring() -> None:
    page = docs.settings_page()
    assert ("| `MIGRATOR_STREAM_LINK_SECONDS` | `int` | `60` | >= 1, <= 3600 | How long a "
            "signed link") in page
    assert "| `MIGRATOR_CHECKPOINT_TTL` | `float` \\| `null` | unset | > 0 |" in page
    assert len([line for line in page.splitlines() if line.startswith("| `MIGRATOR_")]) == len(
        Settings.model_fields)


def test_a_new_field_is_rendered_with_no_change_to_the_generator() -> None:
    class Example(BaseModel):
        """An example."""

        model_config = ConfigDict(use_attribute_docstrings=True)

        size: int | None = Field(default=None, ge=1)
        """How | big, with a
        line break."""
        mode: list[str] = ["a"]

    assert docs.rows(Example, {"size": "size", "mode": "mode"}, "`null`", "Field")[2:] == [
        "| `size` | `int` \\| `null` | `null` | >= 1 | How \\| big, with a line break. |",
        "| `mode` | `list[str]` | `[\"a\"]` |  |  |",
    ]
    assert docs.undocumented(Example) == ["Example.mode"]


def test_the_command_writes_every_page(tmp_path: Path) -> None:
    assert docs.main(["--root", str(tmp_path)]) == 0
    for path, text in docs.pages().items():
        assert (tmp_path / path).read_text() == text
