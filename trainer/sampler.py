"""Exactly-once sampling: a seeded per-epoch permutation and a cursor that moves only on commit.

With a fixed global batch (the default), a step's window is the next `global_batch` sample
positions after the cursor, whoever takes part: it is cut into shards of `batch_size`, and with
`k` participants participant `r` computes the `r`-th of `k` near-equal runs of shards (none
where there are more participants than shards). Without one (an elastic batch), the window is
the next `k * batch_size` positions and participant `r` takes the `r`-th of `k` near-equal
slices of it. `commit()` advances the cursor past the window; a step that is aborted is simply
not committed, so the same window is handed out again (possibly to a different set of
participants).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Assignment:
    """What one participant trains on in one step."""

    epoch: int
    cursor: int
    window: int
    """Sample positions the whole step consumes (all participants together)."""
    indices: np.ndarray
    """This participant's sample ids (indices into the training split)."""
    shards: tuple[tuple[int, np.ndarray], ...] = ()
    """With a fixed global batch: this participant's shards, (shard number in the step, its
    sample ids), in order; `indices` is theirs together."""
    window_ids: np.ndarray | None = None
    """With a fixed global batch: the whole step's sample ids, every participant's."""


class GlobalSampler:
    def __init__(self, num_samples: int, batch_size: int, seed: int,
                 global_batch: int | None = None) -> None:
        if num_samples < 1:
            raise ValueError("num_samples must be positive")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.global_batch = global_batch
        """Samples per step whoever takes part; None: `batch_size` per participant."""
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self._order_epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's permutation of sample ids: the same on every pod for a given seed."""
        if epoch != self._order_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = rng.permutation(self.num_samples)
            self._order_epoch = epoch
        return self._order

    def assign(self, rank: int, participants: int) -> Assignment:
        """Participant `rank`'s share of the next (uncommitted) step."""
        if not 0 <= rank < participants:
            raise ValueError(f"rank {rank} outside 0..{participants - 1}")
        if self.global_batch is not None:
            return self._assign_shards(rank, participants, self.global_batch)
        window = self.order(self.epoch)[self.cursor:self.cursor + self.batch_size * participants]
        share = np.array_split(window, participants)[rank]
        return Assignment(self.epoch, self.cursor, len(window), share)

    def _assign_shards(self, rank: int, participants: int, global_batch: int) -> Assignment:
        window = self.order(self.epoch)[self.cursor:self.cursor + global_batch]
        cuts = range(self.batch_size, len(window), self.batch_size)
        numbered = list(enumerate(np.split(window, cuts)))
        mine = tuple(numbered[i] for i in np.array_split(np.arange(len(numbered)),
                                                         participants)[rank])
        indices = (np.concatenate([shard for _, shard in mine]) if mine
                   else np.empty(0, dtype=window.dtype))
        return Assignment(self.epoch, self.cursor, len(window), indices, mine, window)

    def commit(self, assignment: Assignment) -> bool:
        """Advance past a committed step; return True when that step ended the epoch."""
        if (assignment.epoch, assignment.cursor) != (self.epoch, self.cursor):
            raise ValueError(
                f"commit of a stale step (epoch {assignment.epoch}, cursor {assignment.cursor}); "
                f"sampler is at epoch {self.epoch}, cursor {self.cursor}")
        self.cursor += assignment.window
        if self.cursor >= self.num_samples:
            self.epoch += 1
            self.cursor = 0
            return True
        return False

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "num_samples": self.num_samples,
                "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_samples"] != self.num_samples or state["seed"] != self.seed:
            raise ValueError(
                f"checkpoint was made for {state['num_samples']} samples with seed "
                f"{state['seed']}, this run has {self.num_samples} with seed {self.seed}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
