"""Sizes as people read them, in the CLI's tables and the control plane's messages."""

from __future__ import annotations


def human_size(size: float) -> str:
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
