"""The layout of a job's checkpoint directory, read by the API and written by the trainer.

`step-N/` holds `model.pt`, `trainer.pt` and `meta.json` (a pipeline job's: `model-stage-S.pt`
and `trainer-stage-S.pt` for each stage S instead of the first two); it is complete once it holds
the `COMPLETE` marker (written last). Anything else in the directory (`step-N.tmp*` staging, a
`step-N/` without its marker) is an unfinished write that nobody may read.

A later checkpoint of the same step that records more of the work done (the epoch end that an
emergency checkpoint left pending) supersedes it under the next revision's name, `step-N.r1`,
`step-N.r2`...: written whole beside it, marker last, and only then is the older one deleted
(marker first). So a reader always finds a complete checkpoint of the step, and of two
complete revisions takes the newer; nothing is ever replaced in place, which an object store
(no atomic rename) could not do.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from upath import UPath

from trainer.contract.artifact_store import entries, has_file, read_file, remove

logger = logging.getLogger(__name__)

MARKER = "COMPLETE"
MODEL_FILE = "model.pt"
STATE_FILE = "trainer.pt"
META_FILE = "meta.json"


EXPORTED = "config.json"
"""In a job's export: the file whose presence says the export is whole (it is moved in last)."""

METRICS_FILE = "metrics.json"
"""In a job's export: its metrics (by split, each with the step it was evaluated at), sample
counts and spec."""

ADAPTER_DIR = "adapter"
"""In a job's export (the model directory): a LoRA job's adapters alone, beside the merged
model, as peft's `save_pretrained` writes them."""


def export_staging(target: Path | UPath) -> str:
    """What the names of the exports to `target` that are under way start with: each is staged
    next to it, then moved in."""
    return f"{target.name}.tmp-"


def remove_export_staging(target: Path | UPath) -> list[str]:
    """Remove what exports to `target` killed before their move left next to it (never a link);
    the names removed. Only for when no export to `target` can be under way."""
    removed = []
    for sibling in entries(target.parent):
        link = isinstance(sibling, Path) and sibling.is_symlink()  # stores have no links
        if sibling.name.startswith(export_staging(target)) and not link:
            logger.info("removing %s, left by a killed export", sibling)
            remove(sibling)
            removed.append(sibling.name)
    return removed


def shard_files(shard: str) -> tuple[str, str]:
    """The model and trainer files of one shard (a pipeline stage) of a checkpoint."""
    return f"model-{shard}.pt", f"trainer-{shard}.pt"


NAME = re.compile(r"^step-(\d{1,12})(?:\.r(\d{1,6}))?$")
"""A checkpoint's directory name; the groups are its step and revision (none: revision 0)."""


STAGING = re.compile(r"^step-\d{1,12}\.tmp")
"""Where a checkpoint is written before it is renamed to its name (`step-N.tmp[-suffix]`)."""


def checkpoint_name(step: int, revision: int = 0) -> str:
    return f"step-{step}.r{revision}" if revision else f"step-{step}"


def staging_name(step: int, suffix: str = "") -> str:
    return f"{checkpoint_name(step)}.tmp{suffix}"


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path | UPath
    step: int
    meta: dict[str, Any]
    """`meta.json`: epoch, cursor, epoch_end, emergency, finetune, base_model (what a LoRA
    checkpoint's trainable part applies to), metrics.val_accuracy, step, saved_at."""
    revision: int = 0
    """How many checkpoints of the same step this one superseded."""

    @property
    def val_accuracy(self) -> float | None:
        value = self.meta.get("metrics", {}).get("val_accuracy")
        return float(value) if value is not None else None


def read_info(path: Path | UPath) -> CheckpointInfo:
    match = NAME.match(path.name)
    if match is None:
        raise ValueError(f"{path} is not a step-N checkpoint directory")
    return CheckpointInfo(path, int(match.group(1)), json.loads(read_file(path, META_FILE)),
                          int(match.group(2) or 0))


def _complete(paths: list[Path | UPath]) -> list[CheckpointInfo]:
    """The complete checkpoints among `paths`, by step and revision; a link is none
    (trainer.contract.artifact_store)."""
    found = []
    for path in paths:
        if NAME.match(path.name) and has_file(path, MARKER):
            try:
                found.append(read_info(path))
            except (OSError, ValueError) as exc:
                logger.warning("ignoring unreadable checkpoint %s: %s", path, exc)
    return sorted(found, key=lambda info: (info.step, info.revision))


def _newest_revisions(found: list[CheckpointInfo]) -> list[CheckpointInfo]:
    """Of each step in `found` (sorted), its newest revision."""
    return list({info.step: info for info in found}.values())


def list_checkpoints(directory: Path | UPath) -> list[CheckpointInfo]:
    """Complete checkpoints, oldest step first; of a step, only its newest revision (an older
    one is superseded: its deletion is under way or was cut short, see `apply_retention`)."""
    return _newest_revisions(_complete(entries(directory)))


def checkpoint_at(directory: Path | UPath, step: int) -> CheckpointInfo | None:
    """The newest complete revision of `step`'s checkpoint, if there is one."""
    found = _complete([path for path in entries(directory)
                       if (match := NAME.match(path.name)) and int(match.group(1)) == step])
    return found[-1] if found else None


def remove_checkpoint(path: Path | UPath) -> None:
    """Delete a checkpoint, its marker first: a deletion cut short never leaves something that
    looks complete to a reader (a resume, a download)."""
    remove(path, first=MARKER)


def apply_retention(directory: Path | UPath, keep: int) -> list[Path | UPath]:
    """Delete all but the newest `keep` complete checkpoints and the best by validation
    accuracy (the newer of equals), and any superseded revision; the paths deleted."""
    everything = _complete(entries(directory))
    found = _newest_revisions(everything)
    kept = {info.path for info in found[-keep:]}
    scored = [info for info in found if info.val_accuracy is not None]
    if scored:
        best = max(scored, key=lambda info: (info.val_accuracy, info.step))
        kept.add(best.path)
    removed = [info.path for info in everything if info.path not in kept]
    for path in removed:
        remove_checkpoint(path)
    return removed


def latest_checkpoint(directory: Path | UPath) -> CheckpointInfo | None:
    """The complete checkpoint with the highest step (never chosen by file time)."""
    found = list_checkpoints(directory)
    return found[-1] if found else None
