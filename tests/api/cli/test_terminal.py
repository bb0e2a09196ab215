"""api/terminal.py: text from pods prints as what it reads, never as terminal controls."""

from __future__ import annotations

import io

from api.cli.terminal import echo, printable


def test_every_control_character_is_shown_as_an_escape() -> None:
    controls = [chr(c) for c in [*range(0x00, 0x09), *range(0x0a, 0x20), *range(0x7f, 0xa0)]]
    for char in controls:
        assert printable(char) == f"\\x{ord(char):02x}"
    for char in "\u061c\u200e\u200f\u202a\u202e\u2066\u2069\u2028\u2029\ud800\udfff":
        assert printable(char) == f"\\u{ord(char):04x}"
    shown = printable("".join(controls))
    assert shown.isprintable() and printable(shown) == shown  # escaping twice changes nothing


def test_text_stays_as_it_is() -> None:
    text = "café ✓ 日本語 [bold]not markup[/] \\x1b\ttab"
    assert printable(text) == text


def test_echo_prints_one_line_per_argument() -> None:
    out = io.StringIO()
    echo("a\nb", "", 3, file=out)
    assert out.getvalue() == "a\\x0ab\n\n3\n"
