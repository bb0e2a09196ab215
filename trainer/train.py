"""The training loop every pod runs: committed, redoable steps through this pod's part of the
model (trainer.part), whole or a pipeline stage, data-parallel over the group's replicas."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer import nonfinite
from trainer.checkpoint import CheckpointInfo
from trainer.checkpointer import Checkpointer
from trainer.config import TrainConfig
from trainer.contract import records
from trainer.data import TokenizedSplit
from trainer.distributed import Group
from trainer.evaluation import evaluate
from trainer.export import export_model
from trainer.finish import Finish
from trainer.membership import Membership
from trainer.model import model_labels, unwrap
from trainer.part import ModelPart, build_part
from trainer.prepare import Prepared, prepared_for
from trainer.progress import StepReports, StepResult
from trainer.recovery import Recovery
from trainer.report import Reporter
from trainer.sampler import Assignment, GlobalSampler
from trainer.schedule import LinearSchedule, OptimizerLoader, build_optimizer, start_state
from trainer.shards import ShardSums, seed_shard
from trainer.state import rng_state, set_rng_state, weights_checksum

logger = logging.getLogger(__name__)


class Trainer:
    """One pod's training of its job: committed steps, epochs, the final evaluation and export."""

    config: TrainConfig
    group: Group
    reporter: Reporter
    tokenizer: Any
    train_data: TokenizedSplit
    validation_data: TokenizedSplit
    test_data: TokenizedSplit
    data_sizes: dict[str, int]
    part: ModelPart
    """This pod's part of the model (the whole model or a pipeline stage) and how steps,
    evaluations, checkpoints, heals and the export go through it."""
    model: nn.Module
    """What this pod trains (`part.module`)."""
    optimizer: torch.optim.Optimizer
    schedule: LinearSchedule
    sampler: GlobalSampler
    recovery: Recovery
    """The fault-tolerance rules of the group's mode."""
    checkpointer: Checkpointer
    """When to checkpoint, and resume."""
    membership: Membership
    """Reports this pod's readiness, heals, joins and leaves, and the group's quorums."""
    progress: StepReports
    """Reports each committed step."""
    finishing: Finish
    """An early finish the control plane asked for, once the participants agreed on it."""
    step: int
    """Committed optimizer steps of the whole job."""
    samples_seen: int
    """Training samples consumed by committed steps, over all epochs."""
    skipped_steps: int
    """Committed steps whose gradients were not finite, skipped (`nonfinite_loss: "skip"`)."""
    epoch_end_pending: bool
    """The last committed step ended an epoch whose evaluation and checkpoint are not done."""
    metrics: dict[str, Any]
    """Latest evaluation results by split, e.g. {"validation": {"accuracy": ...}}."""
    stop_reason: str | None
    """Why `fit` stopped early: `left` (SIGTERM, and live peers go on without this pod),
    `sigterm` (SIGTERM, after a checkpoint) or `peer` (another participant's SIGTERM)."""
    resumed_from: CheckpointInfo | None
    """The checkpoint this process resumed from, if any."""

    def __init__(self, config: TrainConfig, group: Group, reporter: Reporter,
                 prepared: Prepared | None = None) -> None:
        """`prepared`: what a standby loaded for this pod (used where it fits)."""
        self.config, self.group, self.reporter = config, group, reporter
        spec, runtime = config.spec, config.runtime
        prepared = prepared_for(config, group.device.device, prepared)
        self.tokenizer = prepared.tokenizer
        self.train_data, self.validation_data, self.test_data = (
            prepared.train, prepared.validation, prepared.test)
        self.data_sizes = {"train": len(self.train_data), "validation": len(self.validation_data),
                           "test": len(self.test_data)}
        self.labels = model_labels(prepared.model)
        self.part = build_part(prepared.model, group, config)
        self.model = self.part.module
        # Set before a step when evaluation (or loading) left the modules in eval mode: a walk
        # of the module tree each step costs milliseconds of host time.
        self._training_mode = False
        self.optimizer = build_optimizer(unwrap(self.model), spec)
        self.optimizer_loader = OptimizerLoader(self.optimizer)
        self.schedule = LinearSchedule(spec.learning_rate, spec.warmup_ratio,
                                       spec.epochs * len(self.train_data))
        self.sampler = GlobalSampler(len(self.train_data), spec.batch_size, spec.seed,
                                     spec.global_batch_size if spec.constant_batch else None)
        self.shards = ShardSums(self.part, group) if spec.constant_batch else None
        self.step, self.samples_seen, self.epoch_end_pending, self.metrics = 0, 0, False, {}
        self.skipped_steps = 0
        self.stop_reason = None
        self.recovery = group.recovery(runtime.checkpoint_dir, runtime.model_dir)
        self.checkpointer = Checkpointer(config, group, reporter, self.part, self.recovery,
                                         self.state_dict)
        self.membership = Membership(group, reporter, runtime.ready_file)
        self.progress = StepReports(config, group, reporter, self.sampler,
                                    self.part.reports_samples)
        self.finishing = Finish(reporter, spec.epochs, spec.constant_batch or not group.heals)
        self._stop_requested = False
        self._first_step = True
        self.resumed_from = None
        latest = self.checkpointer.newest_before_training()
        if latest is not None:
            self.resume(latest)
        elif group.heals:  # a heal reads the moments into these, not into new memory
            start_state(self.optimizer)
        group.register_state(self._load_live_state, self._live_state)

    # --- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.schedule.state_dict(),
                "sampler": self.sampler.state_dict(), "rng": rng_state(),
                "progress": {"step": self.step, "samples_seen": self.samples_seen,
                             "skipped_steps": self.skipped_steps,
                             "epoch_end_pending": self.epoch_end_pending,
                             "finish_epoch": self.finishing.epoch},
                "metrics": self.metrics}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A live heal's optimizer moments arrive while this pod computes its first step.
        self.optimizer_loader.load(state["optimizer"])
        self.schedule.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = int(state["progress"]["step"])
        self.samples_seen = int(state["progress"]["samples_seen"])
        self.skipped_steps = int(state["progress"].get("skipped_steps", 0))
        self.epoch_end_pending = bool(state["progress"].get("epoch_end_pending", False))
        self.finishing.epoch = state["progress"].get("finish_epoch")
        self.metrics = state["metrics"]
        if self.shards is not None:  # the weights changed: no failed attempt holds for them
            self.shards.settled()

    def _live_state(self) -> dict[str, Any]:
        """What a pod that (re)joins a live group fetches from a peer."""
        return {"model": self.part.live_state(), "trainer": self.state_dict(),
                "pod": self.reporter.pod}

    def _load_live_state(self, state: dict[str, Any]) -> None:
        self.part.load_live_state(state["model"])
        self.load_state_dict(state["trainer"])
        self.membership.healed(state["pod"], self.step, self.sampler.epoch + 1,
                               self.sampler.cursor)

    def resume(self, info: CheckpointInfo) -> None:
        # Loaded on the CPU: RNG states must stay there, and load_state_dict copies to the device.
        self.load_state_dict(self.checkpointer.load(info))
        self.resumed_from = info
        logger.info("resumed from %s: epoch %d, step %d, cursor %d", info.path.name,
                    self.sampler.epoch + 1, self.step, self.sampler.cursor)
        self.reporter.emit(records.Resumed(message=f"resumed from {info.path.name}",
                                   checkpoint=info.path.name, step=self.step,
                                   epoch=self.sampler.epoch + 1, cursor=self.sampler.cursor))

    # --- training ------------------------------------------------------------------------

    def train_step(self) -> StepResult:
        """Form the step's group, compute and synchronise, and commit if the group agrees."""
        self.group.start_step()
        self.membership.observe(self.step)
        participants = self.group.participants
        assignment = self.sampler.assign(self.group.rank, participants)
        # A pod that heals from a peer ahead (a recreated one) loads no checkpoint: it learns
        # so at the first step's quorum, and resumes only if no live peer was ahead.
        first, self._first_step = self._first_step and self.step == 0, False
        newest = self.checkpointer.newest_at_first_step() if first else None
        idle = self.group.healing or newest is not None
        used = np.empty(0, dtype=np.int64) if idle else assignment.indices
        if not idle and not self.membership.ready:
            self.membership.mark_ready()
        self._train_mode()
        votes = self.finishing.votes()
        stats, grad_norm = (self._compute_shards(assignment, idle, votes)
                            if self.shards is not None
                            else self._compute_share(assignment, idle, votes))
        committed = self.group.should_commit()
        self.optimizer_loader.arrived()
        if committed and self.shards is not None:
            self.shards.settled()
        loss_total, counted, stops = stats.tolist()
        skipped = None
        if newest is not None and self.step == 0:  # no live peer was ahead: resume instead
            self.resume(newest)
            self.group.resume_at(self.step)
            committed = False
        elif committed:
            # Judged from the synchronised gradients: every participant fails or skips alike.
            skipped = nonfinite.check(self.step + 1, loss_total / counted if counted else None,
                                      grad_norm, self.config.spec.nonfinite_loss)
            # Read after should_commit: a pod that just healed holds the peers' progress.
            for group in self.optimizer.param_groups:
                group["lr"] = self.schedule.lr_at(self.samples_seen)
            if skipped is None:
                self.optimizer.step()
            else:
                self.skipped_steps += 1
            assignment = self.sampler.assign(self.group.rank, participants)
            self.sampler.commit(assignment)
            self.step += 1
            self.samples_seen += assignment.window
            self.finishing.settle(votes, assignment.epoch, self.step)
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(committed, loss_total / max(counted, 1.0), assignment, used, stops > 0,
                          took_part=not idle, skipped=skipped)

    def _train_mode(self) -> None:
        if not self._training_mode:
            self.model.train()
            self._training_mode = True

    def _compute_shards(self, assignment: Assignment, idle: bool, votes: torch.Tensor
                        ) -> tuple[torch.Tensor, float]:
        """A fixed global batch's step (trainer.shards): (the step's loss summed, its samples,
        the stops requested), every participant's; and the gradients' norm; `votes` summed.
        Only the stops are summed here: a live group's stay local (each pod leaves alone)."""
        assert self.shards is not None
        loss_sum, counted, grad_norm = self.shards.step(assignment, self.train_data, idle,
                                                        self.config.spec, votes)
        stops = self.group.all_reduce_sum(torch.tensor([float(self._stop_requested)]))
        return torch.tensor([loss_sum, counted, float(stops[0])], dtype=torch.float64), grad_norm

    def _compute_share(self, assignment: Assignment, idle: bool, votes: torch.Tensor
                       ) -> tuple[torch.Tensor, float]:
        """An elastic batch's step: forward and backward of this pod's share, gradients
        synchronised and clipped; (the loss summed over the samples counted, those samples,
        the stops requested: all participants' in a static world, this pod's in a live one,
        whose statistics stay local, as `votes` do), and the gradients' norm. A pipeline's
        earlier stages count none: the last one holds the loss."""
        seed_shard(self.config.spec.seed, assignment, self.group.rank)
        indices, weight = assignment.indices, 1.0
        if len(indices) == 0 or idle:
            # Nothing to train on (fewer samples left than participants, or this pod is still
            # fetching the live state or may resume): join the collective with a zero weight.
            indices, weight = self.sampler.order(assignment.epoch)[:1], 0.0
        # Gradients are averaged over participants; scaling by participants/window makes the
        # result the mean over every sample of the step, however unevenly split.
        loss, counted = self.part.forward_backward(self.train_data.batch(indices), weight,
                                                   self.group.participants / assignment.window)
        norm = self.part.sync_and_clip(self.config.spec.max_grad_norm)
        stats = self.group.all_reduce_sum(torch.cat([torch.tensor(
            [float(loss), counted, float(self._stop_requested)], dtype=torch.float64), votes]))
        votes.copy_(stats[3:])
        return stats[:3], norm

    def train(self) -> dict[str, Any]:
        """Run the remaining epochs, evaluate on test, export; return the final metrics."""
        if self.fit():
            self.finish()
        return self.metrics

    def fit(self) -> bool:
        """Train through the remaining epochs; False when stopped early (see `stop_reason`)."""
        self.reporter.emit(records.Started(message="training started", step=self.step,
                                           epoch=self.sampler.epoch + 1, samples=self.data_sizes,
                                           parameters=self.part.parameter_counts()))
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            if self.epoch_end_pending:  # resumed from an emergency checkpoint at an epoch end
                self._end_epoch(self.sampler.epoch - 1)
            finished = not self._run_epochs(self.config.runtime.max_steps)
            self.progress.outlived()
            self.checkpointer.wait()  # the last checkpoint is durable before anything else
            if finished and self.sampler.epoch >= self.finishing.last_epoch:
                self.checkpointer.save_final(self.step, self.sampler, self.metrics)
            return finished
        except Exception as error:
            # A non-finite loss is no failed collective: its last committed step needs no copy.
            if not isinstance(error, nonfinite.NonFiniteLoss):
                self.checkpointer.save_after_failure(self.step, self.sampler, self.metrics)
            self.progress.outlived()  # a survivor: its last step stays (or is redone alike)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def finish(self) -> None:
        """Evaluate on test, export the model (the primary, or a live pod that outlived it)
        and report completion; after a restart, what an earlier run of the job did already is
        reported, not redone."""
        spec, runtime = self.config.spec, self.config.runtime
        checksum = weights_checksum(self.model)
        model_dir, exported = None, self.recovery.exported(self.step)
        if exported is not None:
            self.metrics = exported
            self.reporter.emit(records.Evaluation(split="test", **exported["test"]))
            model_dir = str(runtime.model_dir) if self.group.is_primary else None
        else:
            self.metrics["test"] = self.evaluate(self.test_data, "test")
            export = self.part.export()  # a collective for a pipeline: every pod calls it
            if export is not None and self.recovery.exports(self.group.is_primary):
                whole, adapter = export
                model_dir = str(export_model(whole, self.tokenizer, runtime.model_dir, spec,
                                             self.metrics, self.data_sizes,
                                             shared=self.recovery.shared_writes,
                                             adapter=adapter))
        self.reporter.emit(records.Completed(message="training completed", step=self.step,
                                     model_dir=model_dir, metrics=self.metrics,
                                     checksum=checksum, primary=self.group.is_primary))

    def _run_epochs(self, max_steps: int | None) -> bool:
        """Train until every epoch is done (False) or a stop was requested and saved (True)."""
        self.progress.start_window()
        while self.sampler.epoch < self.finishing.last_epoch:
            if max_steps is not None and self.step >= max_steps:
                return False
            result = self.train_step()
            self.progress.outlived()  # the step before: its peers committed it, or this pod
            if not result.committed:
                if self.epoch_end_pending:  # resumed at an epoch end, before its evaluation
                    self._end_epoch(self.sampler.epoch - 1)
                continue
            assignment = result.assignment
            self.progress.committed(result, self.step, self.samples_seen, self.skipped_steps,
                                    self.optimizer.param_groups[0]["lr"])
            if not self.membership.joined and len(result.used):
                self.membership.join(self.step, assignment.epoch + 1)
            if self._stop_requested and self.group.can_leave():
                self._leave(assignment)
                return True
            epoch_ended = self.sampler.epoch != assignment.epoch
            if epoch_ended:
                self.epoch_end_pending = True
                self._end_epoch(assignment.epoch)
                self.progress.start_window()
            elif self.checkpointer.due(self.step) and not result.stop_requested:
                self.checkpointer.save(self.step, self.sampler, self.metrics, epoch_end=False)
            if result.stop_requested:
                self.checkpointer.save_at_stop(self.step, self.sampler, self.metrics, epoch_ended)
                self.progress.outlived()
                self.stop_reason = "sigterm" if self._stop_requested else "peer"
                self.reporter.emit(records.Stopped(message="stopped on SIGTERM after a checkpoint"
                                           if self._stop_requested else
                                           "stopped with a participant that got SIGTERM",
                                           step=self.step))
                return True
        return False

    def _leave(self, last: Assignment) -> None:
        """Leave gracefully after the step just committed (see Membership.leave)."""
        self.progress.outlived()
        self.membership.leave(self.step, last.epoch + 1)
        self.stop_reason = "left"

    def _end_epoch(self, epoch: int) -> None:
        """Validation, the epoch-end checkpoint and event for `epoch` (counted from 0)."""
        self.group.barrier()  # every participant committed the epoch's last step: report it
        self.progress.outlived()
        self.metrics["validation"] = self.evaluate(self.validation_data, "validation")
        self.epoch_end_pending = False
        self.checkpointer.save(self.step, self.sampler, self.metrics, epoch_end=True)
        self.reporter.emit(records.EpochEnd(message=f"epoch {epoch + 1} done", epoch=epoch + 1,
                                    step=self.step))

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        logger.info("SIGTERM: stopping after the current step")
        self._stop_requested = True
        self.group.stopping()

    # --- evaluation ----------------------------------------------------------------------

    def evaluate(self, data: TokenizedSplit, split: records.EvalSplit) -> dict[str, Any]:
        """Evaluate on `split`, log and report it; the result with its epoch and step."""
        self._training_mode = False
        result: dict[str, Any] = {**evaluate(unwrap(self.model), data, self.group,
                                             self.config.spec.eval_batch_size, self.part.logits,
                                             classes=len(self.labels)),
                                  "epoch": self.sampler.epoch, "step": self.step}
        logger.info("%s: accuracy %.4f f1 %.4f loss %.4f (%d samples)", split,
                    result["accuracy"], result["f1"], result["loss"], result["samples"])
        self.reporter.emit(records.Evaluation(split=split, **result))
        return result

    def close(self) -> None:
        self.group.close()

