"""This pod's place in its group as the job's reports show it: ready, healed, joined, left; and
the quorums and primaries the primary sees."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainer.contract import records
from trainer.distributed import Group
from trainer.report import Reporter

logger = logging.getLogger(__name__)


class Membership:
    """Reports this pod's membership changes, each once."""

    ready: bool
    """This process took part in a step (its ready file exists, where it has one)."""
    joined: bool
    """This process took part in a committed step."""

    def __init__(self, group: Group, reporter: Reporter, ready_file: Path | None) -> None:
        self.group, self.reporter, self.ready_file = group, reporter, ready_file
        if ready_file is not None:  # a container restarted in place keeps its /tmp
            ready_file.unlink(missing_ok=True)
        self.ready = self.joined = False
        self._heal: dict[str, Any] = {}
        self._membership: tuple[int, int] | None = None
        self._was_primary = False

    def observe(self, step: int) -> None:
        """Report membership changes: quorums and primaries (job-level, so by the primary)."""
        primary = self.group.is_primary
        # A healing pod joins a quorum one step before it participates: count both changes.
        membership = (self.group.quorum_id, self.group.participants)
        if primary and membership != self._membership:
            self.reporter.emit(records.Quorum(message=f"{self.group.participants} participants",
                                              quorum_id=membership[0],
                                              participants=membership[1], step=step))
        if primary and not self._was_primary:
            self.reporter.emit(records.Primary(message=f"{self.reporter.pod} is the primary",
                                               pod=self.reporter.pod, step=step))
        self._membership, self._was_primary = membership, primary

    def mark_ready(self) -> None:
        """This process participates in a step for the first time (it holds the live state and
        its step's group is formed): create the ready file. A migration then retires the pod's
        old incarnation, which is in this step's group too: it commits this step beside its
        replacement and leaves after it (make before break)."""
        self.ready = True
        if self.ready_file is not None:
            self.ready_file.parent.mkdir(parents=True, exist_ok=True)
            self.ready_file.touch()

    def healed(self, source: str, step: int, epoch: int, cursor: int) -> None:
        """This pod loaded the live state of `source` at `step` (epoch counted from 1)."""
        transfer = self.group.take_heal_report() or {}
        self._heal = transfer
        logger.info("healed from %s: epoch %d, step %d, cursor %d, %d bytes in %.2f s",
                    source, epoch, step, cursor, transfer.get("bytes", 0),
                    transfer.get("seconds", 0.0))
        self.reporter.emit(records.Healed(
            message=f"fetched the live state from {source}", source=source,
            target=self.reporter.pod, step=step, epoch=epoch, cursor=cursor, **transfer))

    def join(self, step: int, epoch: int) -> None:
        """This process took part in a committed step for the first time: say so."""
        self.joined = True
        self.reporter.emit(records.Joined(
            message=f"{self.reporter.pod} takes part from step {step}",
            pod=self.reporter.pod, step=step, epoch=epoch,
            participants=self.group.participants,
            heal_bytes=int(self._heal.get("bytes", 0)),
            heal_seconds=float(self._heal.get("seconds", 0.0))))

    def leave(self, step: int, epoch: int) -> None:
        """Leave gracefully after the step just committed: the peers hold the same state and go
        on without this pod at once; the epoch end, if this step made one, is theirs."""
        self.group.leave()
        self.reporter.emit(records.Left(message=f"{self.reporter.pod} left the job after step "
                                                f"{step}", pod=self.reporter.pod,
                                        step=step, epoch=epoch))
