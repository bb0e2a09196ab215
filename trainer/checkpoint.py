"""Atomic step checkpoints: `step-N/` directories (trainer.contract.checkpoints), complete only
once they hold a marker.

Write order: `step-N.tmp/` (files fsynced) -> rename to `step-N/` -> `COMPLETE` marker (fsynced).
A process killed at any point leaves either no `step-N/` or one without its marker, and both are
ignored by `latest_checkpoint` and removed by the next save. Emergency saves (`shared=True`) may
race with other survivors writing the same step: each stages in a directory of its own, the first
rename wins, and the content is identical anyway. "Latest" is the highest step number,
never a file time. Retention keeps the last K complete checkpoints plus the best by validation
accuracy.

A step that has a complete checkpoint is saved again only to supersede it (`supersedes`: the
epoch end done that it left pending), as the next revision `step-N.rR/`, written the same way;
the superseded one is deleted after the new marker (trainer.contract.checkpoints). So a resume
never redoes an epoch end that a restart already did.

The directory may be an object store's prefix (trainer.contract.artifact_store): there the files are
uploaded under the staging prefix, moved file by file, and the marker still comes last.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from upath import UPath

from trainer.contract.artifact_store import entries, move, remove, sync_dir, write_durable
from trainer.contract.checkpoints import (
    MARKER,
    META_FILE,
    MODEL_FILE,
    NAME,
    STAGING,
    STATE_FILE,
    CheckpointInfo,
    apply_retention,
    checkpoint_at,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    read_info,
    remove_checkpoint,
    shard_files,
    staging_name,
)

logger = logging.getLogger(__name__)

# The layout's names, re-exported for the trainer's own modules and tests.
__all__ = ["MARKER", "CheckpointInfo", "CheckpointWriter", "apply_retention", "complete_shards",
           "cpu_copy", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "load_shard",
           "read_info", "save_checkpoint", "save_shard"]


def load_torch(path: Path | UPath, map_location: str | torch.device = "cpu") -> Any:
    """`torch.load(weights_only=True)` of a file; from an object store, fetched whole (one read
    instead of the zip reader's many small ranged ones)."""
    source: Path | io.BytesIO = path if isinstance(path, Path) else io.BytesIO(path.read_bytes())
    return torch.load(source, map_location=map_location, weights_only=True)


def strip_module_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """Keys saved from a DDP-wrapped model start with `module.`; the bare model has none."""
    return {k.removeprefix("module."): v for k, v in state.items()}


def supersedes(meta: dict[str, Any], existing: dict[str, Any]) -> bool:
    """Whether a checkpoint with `meta` replaces a complete one of the same step whose meta is
    `existing`: it records the epoch end (its validation done) that the other left pending, as
    an emergency checkpoint saved during that validation does. Else the same step's committed
    state is already saved, and the existing checkpoint stays."""
    return bool(meta.get("epoch_end")) and not existing.get("epoch_end")


def save_checkpoint(directory: Path | UPath, step: int, model_state: dict[str, Any],
                    trainer_state: dict[str, Any], meta: dict[str, Any],
                    keep: int = 3, shared: bool = False) -> CheckpointInfo:
    """Write `step-<step>/` atomically (or its next revision, see `supersedes`), then apply
    retention; where the step's complete checkpoint is not superseded, return it.

    Only the primary calls this, except for emergency saves after a peer failure, when every
    survivor may (`shared=True`: no cleanup, no retention, concurrent writers of a step agree).
    """
    directory.mkdir(parents=True, exist_ok=True)
    existing = checkpoint_at(directory, step)
    if existing is not None and not supersedes(meta, existing.meta):
        return existing
    if shared:
        staging = directory / staging_name(step, f"-{uuid.uuid4().hex[:12]}")
    else:
        _remove_incomplete(directory)
        staging = directory / staging_name(step)
    if staging.exists():
        remove(staging)
    staging.mkdir(parents=True)
    meta = {**meta, "step": step, "saved_at": time.time()}
    write_durable(staging / MODEL_FILE,
                  lambda h: torch.save(strip_module_prefix(model_state), h))
    write_durable(staging / STATE_FILE, lambda h: torch.save(trainer_state, h))
    write_durable(staging / META_FILE, lambda h: h.write(json.dumps(meta, indent=2).encode()))
    sync_dir(staging)
    info = _publish(staging, directory, step, existing, meta, shared)
    if not shared:
        apply_retention(directory, keep)
    return info


def _revision_after(existing: CheckpointInfo | None) -> int:
    return 0 if existing is None else existing.revision + 1


def _publish(staging: Path | UPath, directory: Path | UPath, step: int,
             existing: CheckpointInfo | None, meta: dict[str, Any],
             shared: bool) -> CheckpointInfo:
    """Move the whole `staging` to `step`'s checkpoint name (the revision after `existing`, the
    step's complete checkpoint that it supersedes), mark it complete, then delete `existing`."""
    revision = _revision_after(existing)
    final = directory / checkpoint_name(step, revision)
    try:
        move(staging, final)
    except OSError:
        if not shared or not final.is_dir():
            raise
        # Another survivor renamed its copy first; renamed directories are always whole.
        remove(staging)
        meta = read_info(final).meta
    sync_dir(directory)
    write_durable(final / MARKER, lambda h: h.write(b"ok\n"))
    sync_dir(final)
    if existing is not None:
        logger.info("%s supersedes %s", final.name, existing.path.name)
        remove_checkpoint(existing.path)
    return CheckpointInfo(final, step, meta, revision)


def load_checkpoint(path: Path | UPath, map_location: str | torch.device = "cpu",
                    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(model state without `module.` prefixes, trainer state, meta) of a complete checkpoint."""
    if not (path / MARKER).is_file():
        raise ValueError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    model_state = load_torch(path / MODEL_FILE, map_location)
    trainer_state = load_torch(path / STATE_FILE, map_location)
    return strip_module_prefix(model_state), trainer_state, read_info(path).meta


def save_shard(directory: Path | UPath, step: int, shard: str, model_state: dict[str, Any],
               trainer_state: dict[str, Any]) -> None:
    """Write one shard of checkpoint `step` into its staging directory, which the job's other
    shard writers share; `complete_shards` makes it a checkpoint once all of them wrote."""
    staging = directory / staging_name(step)
    staging.mkdir(parents=True, exist_ok=True)
    model_file, state_file = shard_files(shard)
    write_durable(staging / model_file, lambda h: torch.save(model_state, h))
    write_durable(staging / state_file, lambda h: torch.save(trainer_state, h))


def complete_shards(directory: Path | UPath, step: int, shards: list[str], meta: dict[str, Any],
                    keep: int = 3) -> CheckpointInfo:
    """Make the staged shards of `step` a checkpoint (by one pod, once every shard writer is
    done): meta, rename, marker, retention; then clear unfinished writes of other steps."""
    staging = directory / staging_name(step)
    missing = [s for s in shards for name in shard_files(s) if not (staging / name).is_file()]
    if missing:
        raise ValueError(f"checkpoint {step}: shards {sorted(set(missing))} were not written")
    existing = checkpoint_at(directory, step)
    if existing is not None and not supersedes(meta, existing.meta):
        remove(staging)
        return existing
    meta = {**meta, "step": step, "saved_at": time.time()}
    write_durable(staging / META_FILE, lambda h: h.write(json.dumps(meta, indent=2).encode()))
    sync_dir(staging)
    leftover = directory / checkpoint_name(step, _revision_after(existing))
    if leftover.exists():  # an unfinished earlier write of the same step
        remove(leftover)
    info = _publish(staging, directory, step, existing, meta, shared=False)
    _remove_incomplete(directory)
    apply_retention(directory, keep)
    return info


def load_shard(path: Path | UPath, shard: str, map_location: str | torch.device = "cpu",
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model state, trainer state) of one shard of a complete checkpoint."""
    if not (path / MARKER).is_file():
        raise ValueError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    model_file, state_file = shard_files(shard)
    return (load_torch(path / model_file, map_location),
            load_torch(path / state_file, map_location))


def _remove_incomplete(directory: Path | UPath) -> None:
    for path in entries(directory):
        incomplete = NAME.match(path.name) and not (path / MARKER).exists()
        if incomplete or STAGING.match(path.name):
            logger.info("removing incomplete checkpoint %s", path.name)
            remove(path)


def cpu_copy(state: Any) -> Any:
    """A deep copy of a state dict with every tensor copied to the CPU: a snapshot that later
    training steps cannot change."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: cpu_copy(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(cpu_copy(value) for value in state)
    return state


class CheckpointWriter:
    """Writes one checkpoint at a time in a background thread, from a snapshot.

    Training goes on during the write; in a live group that keeps the primary in step with its
    peers instead of dropping out of a quorum (and healing) at every checkpoint. A failed write
    is raised by the next `submit` or `wait`, as a synchronous write would have been.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, write: Callable[[], CheckpointInfo],
               done: Callable[[CheckpointInfo], None]) -> None:
        """Run `write` (which must only touch snapshots) and then `done` with its result."""
        self.wait()

        def run() -> None:
            try:
                done(write())
            except BaseException as exc:  # handed to the training thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name="checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        """Block until the write in flight (if any) is durable; raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
