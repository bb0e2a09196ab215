"""README.md and docs/: every relative link points to a file or folder of this repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
# An inline link or image, [text](target "title"), or a reference definition, [label]: target.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)",
                  re.MULTILINE)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


def relative_links(text: str) -> list[str]:
    """The relative targets a page links to, without their #fragment; code is not prose."""
    text = CODE.sub("", FENCE.sub("", text))
    targets = (inline or definition for inline, definition in LINK.findall(text))
    return [target.split("#", 1)[0] for target in targets
            if not EXTERNAL.match(target) and not target.startswith("#")]


def test_the_docs_tree_is_there() -> None:
    names = {page.relative_to(ROOT).as_posix() for page in PAGES}
    assert {"README.md", "docs/reference/job-spec.md", "docs/reference/settings.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    broken = [target for target in relative_links(page.read_text())
              if not (page.parent / target).exists()]
    assert broken == [], f"{page.relative_to(ROOT)} links to missing files"


def test_links_are_found_outside_code_only() -> None:
    text = ("See [the spec](docs/job-spec.md#fields), [site](https://example.com), [top](#top)"
            " and ![chart](img/a.png \"A\").\n[ref]: docs/x.md\n`[not](a.md)`\n"
            "```\n[nor](b.md)\n```\n")
    assert relative_links(text) == ["docs/job-spec.md", "img/a.png", "docs/x.md"]
