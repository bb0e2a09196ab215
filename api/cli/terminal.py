"""What the CLI and the demo print, made safe for a terminal.

Much of it comes from pods, through the API: log lines, event messages, failure reasons, a
model's labels. A terminal obeys the control characters in what it prints (ANSI CSI and OSC
sequences move the cursor, rewrite lines, set the title or the clipboard), so a pod, or anyone
with its report token, could otherwise rewrite the user's screen. Every line the CLI prints goes
through `echo`, and every line it hands to rich goes through `printable` (as `Text`, which rich
never reads as markup).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import TextIO

UNPRINTABLE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f"  # C0 but tab (newline too: one line stays one), DEL, C1
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidirectional marks and overrides
    "\u2028\u2029"  # line and paragraph separators
    "\ud800-\udfff]"  # lone surrogates (from JSON's \\ud800): printing them raises
)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` on one line, every control character in it shown as an escape (ESC as `\\x1b`)."""
    return UNPRINTABLE.sub(_escaped, str(text))


def echo(*lines: object, file: TextIO | None = None) -> None:
    """Print each of `lines` as one printable line (to stdout unless `file` is given)."""
    out = file or sys.stdout  # looked up now: a test's capture replaces it after import
    for line in lines:
        print(printable(line), file=out)
    out.flush()



def table(header: Sequence[str], rows: Sequence[Sequence[str]],
          right: Sequence[int] = ()) -> list[str]:
    """Lines of columns padded to their widest cell; the columns in `right` aligned right
    (numbers). Cells are made printable first, so that escapes do not skew the widths."""
    cells = [[printable(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(cell.rjust(width) if i in right else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in cells]
