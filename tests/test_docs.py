"""README.md and docs/: every relative link points to a file of this repository, and every
#fragment into a page to one of its headings."""

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
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)


def targets(text: str) -> list[str]:
    """Every relative target a page links to, #fragment included; code is not prose."""
    text = CODE.sub("", FENCE.sub("", text))
    found = (inline or definition for inline, definition in LINK.findall(text))
    return [target for target in found if not EXTERNAL.match(target)]


def relative_links(text: str) -> list[str]:
    """The files a page links to (a link within the page names none)."""
    return [target.split("#", 1)[0] for target in targets(text) if not target.startswith("#")]


def anchors(page: Path) -> set[str]:
    """The fragments GitHub gives a page's headings: lower case, punctuation dropped, spaces
    to hyphens."""
    headings = HEADING.findall(FENCE.sub("", page.read_text()))
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_the_docs_tree_is_there() -> None:
    names = {page.relative_to(ROOT).as_posix() for page in PAGES}
    assert {"README.md", "docs/reference/job-spec.md", "docs/reference/settings.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    broken = [target for target in relative_links(page.read_text())
              if not (page.parent / target).exists()]
    assert broken == [], f"{page.relative_to(ROOT)} links to missing files"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_fragment_names_a_heading_of_its_page(page: Path) -> None:
    broken = []
    for target in targets(page.read_text()):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path) if path else page
        if fragment and linked.suffix == ".md" and linked.is_file() and (
                fragment not in anchors(linked)):
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)} links to headings that are not there"


def test_a_fragment_is_the_heading_as_github_writes_it(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Two commands, on a fresh machine\n## On Kubernetes (`BACKEND=k8s`)\n"
                    "```\n# not a heading\n```\n")
    assert anchors(page) == {"two-commands-on-a-fresh-machine", "on-kubernetes-backendk8s"}


def test_links_are_found_outside_code_only() -> None:
    text = ("See [the spec](docs/job-spec.md#fields), [site](https://example.com), [top](#top)"
            " and ![chart](img/a.png \"A\").\n[ref]: docs/x.md\n`[not](a.md)`\n"
            "```\n[nor](b.md)\n```\n")
    assert relative_links(text) == ["docs/job-spec.md", "img/a.png", "docs/x.md"]
