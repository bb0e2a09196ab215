"""What each committed step reports: its metric (or the skipped step's event), the ids of the
samples it trained on, and a progress line in the log now and then.

A step's reports leave the pod once the pod has outlived the step. A collective can complete at
one participant and fail at another (a peer killed as it sends its last part): a pod killed just
after committing a step its surviving peers failed, and redo, would otherwise report a step
the job never kept. The trainer says when the pod has outlived its last step
(`StepReports.outlived`): its next step's collectives completed (in a static world every
participant had committed it to take part; a live pod carries it on), the barrier before an
epoch's validation, a failure it lives to handle (after its emergency checkpoint of the step,
where it writes one), the end. The reports keep the time the step committed."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from trainer import nonfinite
from trainer.config import TrainConfig
from trainer.contract import records
from trainer.distributed import Group
from trainer.report import Reporter
from trainer.sampler import Assignment, GlobalSampler

logger = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 10.0
WINDOW_SECONDS = 5.0
"""Throughput is measured over windows of about this long."""


@dataclass
class StepResult:
    """What `Trainer.train_step` did."""

    committed: bool
    loss: float
    assignment: Assignment
    """The step's window as committed (after a heal: as the live peers assigned it)."""
    used: np.ndarray
    """Sample ids this participant trained on (none while healing)."""
    stop_requested: bool
    took_part: bool = True
    """False for a pod that computed nothing in this step (healing, or about to resume)."""
    skipped: nonfinite.NonFiniteStep | None = None
    """Committed without its update: its gradients were not finite."""


class StepReports:
    """Reports committed steps, with the throughput of the current window."""

    def __init__(self, config: TrainConfig, group: Group, reporter: Reporter,
                 sampler: GlobalSampler, reports_samples: bool) -> None:
        """`reports_samples`: whether this pod reports the ids of the samples it trained on."""
        self.config, self.group, self.reporter, self.sampler = config, group, reporter, sampler
        self.reports_samples = reports_samples
        self._last_log = 0.0
        self._held: list[tuple[records.RecordData, float]] = []
        self.start_window()

    def start_window(self) -> None:
        """Measure throughput from now (an evaluation's time is not training's)."""
        self._window_start, self._window_samples = time.perf_counter(), 0

    def committed(self, result: StepResult, step: int, samples_seen: int, skipped_steps: int,
                  learning_rate: float) -> None:
        """Step `step` committed; report it, once the pod has outlived it: where the pod took
        part in it, or else (it healed into the step) its window alone, its metric being its
        peers' to report."""
        assignment = result.assignment
        now = time.perf_counter()
        self._window_samples += assignment.window
        throughput = self._window_samples / max(now - self._window_start, 1e-9)
        if now - self._window_start > WINDOW_SECONDS:
            self._window_start, self._window_samples = now, 0
        if not result.took_part:  # its state holds the step all the same: its window stands
            self._hold_window(result, step)
            return
        if result.skipped is not None:  # a loss to chart it has not: an event instead
            self._hold(result.skipped.record(assignment.epoch + 1, skipped_steps))
        elif not math.isfinite(result.loss):
            # Gradients finite all the same: this pod's did not count (torchft's first step,
            # in which it only takes the first replica's weights).
            logger.warning("step %d: loss %s here, but not in the update", step, result.loss)
        else:
            self._hold(records.Metric(
                step=step, epoch=assignment.epoch + 1, loss=result.loss,
                learning_rate=learning_rate, samples_per_second=throughput,
                participants=self.group.participants, samples_seen=samples_seen))
        self._hold_window(result, step)
        self._log(step, assignment.epoch, samples_seen, result.loss, throughput)

    def _hold_window(self, result: StepResult, step: int) -> None:
        """The step's window and the ids this pod trained on (`log_sample_ids`). A pod that
        healed into the step trained on none of it, yet holds it: it reports the window too, so
        the step stays on record where every pod that computed it dies before its reports
        leave."""
        if self.config.runtime.log_sample_ids and self.reports_samples:
            assignment = result.assignment
            window = self.sampler.order(assignment.epoch)[
                assignment.cursor:assignment.cursor + assignment.window]
            self._hold(records.SampleIds(step=step, epoch=assignment.epoch + 1,
                                         cursor=assignment.cursor, rank=self.group.rank,
                                         ids=result.used.tolist(), window=window.tolist()))

    def outlived(self) -> None:
        """This pod outlived the steps it holds the reports of: send them."""
        for record, at in self._held:
            self.reporter.emit(record, at=at)
        self._held.clear()

    def _hold(self, record: records.RecordData) -> None:
        self._held.append((record, time.time()))

    def _log(self, step: int, epoch: int, samples_seen: int, loss: float,
             throughput: float) -> None:
        now = time.monotonic()
        if now - self._last_log < LOG_EVERY_SECONDS and step > 1:
            return
        self._last_log = now
        spec = self.config.spec
        total = spec.epochs * self.sampler.num_samples
        logger.info("step %d epoch %d/%d %.1f%% loss %.4f %.1f samples/s", step, epoch + 1,
                    spec.epochs, 100 * samples_seen / total, loss, throughput)
