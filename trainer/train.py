"""The training loop every pod runs: data-parallel fine-tuning with committed, redoable steps."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from trainer import checkpoint, lora, nonfinite
from trainer.config import TrainConfig
from trainer.contract import records, store
from trainer.contract.spec import JobSpec
from trainer.data import TokenizedSplit
from trainer.distributed import Group
from trainer.evaluation import evaluate
from trainer.export import export_model
from trainer.model import load_model, resolve_model, unwrap
from trainer.pipeline import Pipelined, PipelineModel
from trainer.prepare import Prepared, prepare
from trainer.recovery import Recovery
from trainer.report import Reporter
from trainer.sampler import Assignment, GlobalSampler
from trainer.schedule import LinearSchedule, build_optimizer
from trainer.state import rng_state, set_rng_state, weights_checksum

logger = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 10.0


@dataclass
class StepResult:
    committed: bool
    loss: float
    assignment: Assignment
    """The step's window as committed (after a heal: as the live peers assigned it)."""
    used: np.ndarray
    """Sample ids this participant trained on (none while healing)."""
    stop_requested: bool
    took_part: bool = True
    """False for a pod that fetched the live state in this step instead of computing it."""
    skipped: nonfinite.NonFiniteStep | None = None
    """Committed without its update: its gradients were not finite."""


class Trainer:
    config: TrainConfig
    group: Group
    reporter: Reporter
    tokenizer: Any
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LinearSchedule
    train_data: TokenizedSplit
    validation_data: TokenizedSplit
    test_data: TokenizedSplit
    sampler: GlobalSampler
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
    checkpoints: checkpoint.CheckpointWriter
    """Writes the primary's checkpoints in the background while training goes on."""
    recovery: Recovery
    """The fault-tolerance rules of the group's mode."""

    def __init__(self, config: TrainConfig, group: Group, reporter: Reporter,
                 prepared: Prepared | None = None) -> None:
        self.config, self.group, self.reporter = config, group, reporter
        spec, runtime = config.spec, config.runtime
        self.device = group.device
        if prepared is None or not prepared.fits(config, self.device.device):
            prepared = prepare(config, self.device.device)
        self.tokenizer = prepared.tokenizer
        self.train_data, self.validation_data, self.test_data = (
            prepared.train, prepared.validation, prepared.test)
        self.data_sizes = {"train": len(self.train_data), "validation": len(self.validation_data),
                           "test": len(self.test_data)}
        model = prepared.model
        self.pipeline = (PipelineModel(model, group, spec.schedule, spec.microbatches,
                                       spec.batch_size, spec.max_length)
                         if isinstance(group, Pipelined) else None)
        """Pipeline jobs: this pod's stage and how a step runs through it (the rest of the
        model is dropped: other pods hold it)."""
        self.model = self.pipeline.stage if self.pipeline else group.wrap(model)
        self.lora = spec.finetune == "lora"
        """Only the adapters and the head train, are checkpointed and are healed."""
        self.optimizer = build_optimizer(unwrap(self.model), spec)
        self.schedule = LinearSchedule(spec.learning_rate, spec.warmup_ratio,
                                       spec.epochs * len(self.train_data))
        self.sampler = GlobalSampler(len(self.train_data), spec.batch_size, spec.seed)
        self.step, self.samples_seen, self.epoch_end_pending, self.metrics = 0, 0, False, {}
        self.skipped_steps = 0
        self.stop_reason = None
        self.checkpoints = checkpoint.CheckpointWriter()
        self.recovery = group.recovery(runtime.checkpoint_dir, runtime.model_dir)
        if runtime.ready_file is not None:  # a container restarted in place keeps its /tmp
            runtime.ready_file.unlink(missing_ok=True)
        self._stop_requested = False
        self._last_log = 0.0
        self._membership: tuple[int, int] | None = None
        self._first_step = True
        self._was_primary = False
        self._joined = self._ready = False
        self._heal: dict[str, Any] = {}
        self.resumed_from: checkpoint.CheckpointInfo | None = None
        latest = self.recovery.resume_before_training()
        if latest is not None:
            self.resume(latest)
        group.register_state(self._load_live_state, self._live_state)

    # --- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.schedule.state_dict(),
                "sampler": self.sampler.state_dict(), "rng": rng_state(),
                "progress": {"step": self.step, "samples_seen": self.samples_seen,
                             "skipped_steps": self.skipped_steps,
                             "epoch_end_pending": self.epoch_end_pending},
                "metrics": self.metrics}

    def model_state(self) -> dict[str, Any]:
        """The model's state that checkpoints and heals carry: LoRA's trainable part only (the
        frozen base is the pretrained model the spec names), else all of it."""
        model = unwrap(self.model)
        return lora.trainable_state(model) if self.lora else model.state_dict()

    def load_model_state(self, state: dict[str, Any]) -> None:
        model = unwrap(self.model)
        if self.lora:
            lora.load_trainable_state(model, state)
        else:
            model.load_state_dict(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = int(state["progress"]["step"])
        self.samples_seen = int(state["progress"]["samples_seen"])
        self.skipped_steps = int(state["progress"].get("skipped_steps", 0))
        self.epoch_end_pending = bool(state["progress"].get("epoch_end_pending", False))
        self.metrics = state["metrics"]

    def _live_state(self) -> dict[str, Any]:
        """What a pod that (re)joins a live group fetches from a peer."""
        return {"model": self.model_state(), "trainer": self.state_dict(),
                "pod": self.reporter.pod}

    def _load_live_state(self, state: dict[str, Any]) -> None:
        self.load_model_state(state["model"])
        self.load_state_dict(state["trainer"])
        transfer = self.group.take_heal_report() or {}
        self._heal = transfer
        logger.info("healed from %s: epoch %d, step %d, cursor %d, %d bytes in %.2f s",
                    state["pod"], self.sampler.epoch + 1, self.step, self.sampler.cursor,
                    transfer.get("bytes", 0), transfer.get("seconds", 0.0))
        # At step 0 every replica takes the first one's initial weights: a sync, not a heal.
        self.reporter.emit(records.Healed(type="healed" if self.step else "synced",
                                  message=f"fetched the live state from {state['pod']}",
                                  source=state["pod"], target=self.reporter.pod, step=self.step,
                                  epoch=self.sampler.epoch + 1, cursor=self.sampler.cursor,
                                  **transfer))

    def resume(self, info: checkpoint.CheckpointInfo) -> None:
        # Loaded on the CPU: RNG states must stay there, and load_state_dict copies to the device.
        if self.pipeline is not None:
            model_state, trainer_state = checkpoint.load_shard(info.path, self.pipeline.shard)
            self.pipeline.load_model_state(model_state)
        else:
            model_state, trainer_state, _ = checkpoint.load_checkpoint(info.path)
            self.load_model_state(model_state)
        self.load_state_dict(trainer_state)
        self.resumed_from = info
        logger.info("resumed from %s: epoch %d, step %d, cursor %d", info.path.name,
                    self.sampler.epoch + 1, self.step, self.sampler.cursor)
        self.reporter.emit(records.Resumed(message=f"resumed from {info.path.name}",
                                   checkpoint=info.path.name, step=self.step,
                                   epoch=self.sampler.epoch + 1, cursor=self.sampler.cursor))

    # --- training ------------------------------------------------------------------------

    def _seed_step(self, assignment: Assignment) -> None:
        # Dropout masks depend only on (seed, data position, rank), so a step redone after a
        # failure or a resume draws exactly what it drew the first time.
        key = (self.config.spec.seed, assignment.epoch, assignment.cursor, self.group.rank)
        torch.manual_seed(int.from_bytes(hashlib.blake2b(repr(key).encode(),
                                                         digest_size=7).digest(), "little"))

    def train_step(self) -> StepResult:
        """Form the step's group, compute and synchronise, and commit if the group agrees."""
        self.group.start_step()
        self._observe_group()
        participants = self.group.participants
        assignment = self.sampler.assign(self.group.rank, participants)
        # A pod that heals from a peer ahead (a recreated one) loads no checkpoint: it learns
        # so at the first step's quorum, and resumes only if no live peer was ahead.
        newest = self.recovery.resume_at_first_step() if self._first_step else None
        self._first_step = False
        self._seed_step(assignment)
        indices, weight = assignment.indices, 1.0
        idle = self.group.healing or newest is not None
        used = np.empty(0, dtype=np.int64) if idle else assignment.indices
        if not idle and not self._ready:
            self._mark_ready()
        if len(indices) == 0 or idle:
            # Nothing to train on (fewer samples left than participants, or this pod is still
            # fetching the live state or may resume): join the collective with a zero weight.
            indices, weight = self.sampler.order(assignment.epoch)[:1], 0.0
        loss_sum, counted, grad_norm = self._compute(self.train_data.batch(indices), weight,
                                                     participants / assignment.window)
        # Loss over the samples counted: all participants' in a static world, this pod's in a
        # live one (whose statistics stay local).
        stats = self.group.all_reduce_sum(torch.tensor(
            [loss_sum, counted, float(self._stop_requested)], dtype=torch.float64))
        committed = self.group.should_commit()  # a healing pod loads the live state here
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
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(committed, loss_total / max(counted, 1.0), assignment, used, stops > 0,
                          took_part=not idle, skipped=skipped)

    def _compute(self, batch: dict[str, torch.Tensor], weight: float, scale: float,
                 ) -> tuple[float, float, float]:
        """Forward and backward of this pod's share of the step, gradients synchronised and
        clipped: (the loss summed over the share's samples, the samples) times `weight` (0: a
        share that only joins the collectives), and the synchronised gradients' norm. A
        pipeline's earlier stages count none: the last one holds the loss."""
        self.model.train()
        autocast = (torch.autocast(self.device.device.type, dtype=self.device.autocast_dtype)
                    if self.device.autocast_dtype else contextlib.nullcontext())
        max_norm = self.config.spec.max_grad_norm
        # Gradients are averaged over participants; scaling by participants/window (`scale`)
        # makes the result the mean over every sample of the step, however unevenly split.
        if self.pipeline is not None:
            with autocast:
                loss = self.pipeline.forward_backward(batch, weight * scale)
            norm = self.pipeline.sync_and_clip(max_norm)
            counted = weight * len(batch["labels"]) if self.pipeline.stage.is_last else 0.0
            return weight * loss, counted, norm
        batch = {k: v.to(self.device.device, non_blocking=True) for k, v in batch.items()}
        with autocast:
            logits = self.model(input_ids=batch["input_ids"],
                                attention_mask=batch["attention_mask"]).logits
        loss_sum = weight * functional.cross_entropy(logits.float(), batch["labels"],
                                                     reduction="sum")
        (loss_sum * scale).backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        total = (torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
                 if max_norm > 0 else torch.nn.utils.get_total_norm(grads))
        return loss_sum.item(), weight * len(batch["labels"]), total.item()

    def _observe_group(self) -> None:
        """Report membership changes: quorums and primaries (job-level, so by the primary)."""
        primary = self.group.is_primary
        # A healing pod joins a quorum one step before it participates: count both changes.
        membership = (self.group.quorum_id, self.group.participants)
        if primary and membership != self._membership:
            self.reporter.emit(records.Quorum(message=f"{self.group.participants} participants",
                                      quorum_id=membership[0], participants=membership[1],
                                      step=self.step))
        if primary and not self._was_primary:
            self.reporter.emit(records.Primary(message=f"{self.reporter.pod} is the primary",
                                       pod=self.reporter.pod, step=self.step))
        self._membership, self._was_primary = membership, primary

    def train(self) -> dict[str, Any]:
        """Run the remaining epochs, evaluate on test, export; return the final metrics."""
        if self.fit():
            self.finish()
        return self.metrics

    def fit(self) -> bool:
        """Train through the remaining epochs; False when stopped early (see `stop_reason`)."""
        trainable, total = lora.trainable_parameters(unwrap(self.model))
        # A pipeline pod holds one stage: its counts are not the model's.
        counts = {"trainable": trainable, "total": total} if self.pipeline is None else None
        self.reporter.emit(records.Started(message="training started", step=self.step,
                                   epoch=self.sampler.epoch + 1, samples=self.data_sizes,
                                   parameters=counts))
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            if self.epoch_end_pending:  # resumed from an emergency checkpoint at an epoch end
                self._end_epoch(self.sampler.epoch - 1)
            finished = not self._run_epochs(self.config.spec, self.config.runtime.max_steps)
            self.checkpoints.wait()  # the last checkpoint is durable before anything else
            if (finished and self.sampler.epoch >= self.config.spec.epochs
                    and self.recovery.writes_final_checkpoint(self.step, self.group.is_primary)):
                self.save_checkpoint(epoch_end=True, emergency=True)
            return finished
        except nonfinite.NonFiniteLoss:
            raise  # not a failed collective: the last committed step needs no emergency copy
        except Exception:
            if self.recovery.saves_on_failure(self.group.participants):
                self.save_emergency_checkpoint()
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
            whole = self._whole_model()
            if whole is not None and self.recovery.exports(self.group.is_primary):
                model_dir = str(export_model(whole, self.tokenizer, runtime.model_dir, spec,
                                             self.metrics, self.data_sizes,
                                             shared=self.recovery.shared_writes,
                                             adapter=unwrap(self.model) if self.lora else None))
        self.reporter.emit(records.Completed(message="training completed", step=self.step,
                                     model_dir=model_dir, metrics=self.metrics,
                                     checksum=checksum, primary=self.group.is_primary))

    def _run_epochs(self, spec: JobSpec, max_steps: int | None) -> bool:
        """Train until every epoch is done (False) or a stop was requested and saved (True)."""
        window_start, window_samples = time.perf_counter(), 0
        while self.sampler.epoch < spec.epochs:
            if max_steps is not None and self.step >= max_steps:
                return False
            result = self.train_step()
            if not result.committed:
                if self.epoch_end_pending:  # resumed at an epoch end, before its evaluation
                    self._end_epoch(self.sampler.epoch - 1)
                continue
            assignment = result.assignment
            now = time.perf_counter()
            window_samples += assignment.window
            throughput = window_samples / max(now - window_start, 1e-9)
            if now - window_start > 5.0:
                window_start, window_samples = now, 0
            if result.took_part:  # a pod that healed into this step leaves it to its peers
                self._report_step(assignment, result, throughput)
            if not self._joined and len(result.used):
                self._join(assignment)
            if self._stop_requested and self.group.can_leave():
                self._leave(assignment)
                return True
            if self.sampler.epoch != assignment.epoch:
                self.epoch_end_pending = True
                self._end_epoch(assignment.epoch)
                window_start, window_samples = time.perf_counter(), 0
            elif result.stop_requested or (spec.checkpoint_every_steps
                                           and self.step % spec.checkpoint_every_steps == 0):
                self.save_checkpoint(epoch_end=False)
            if result.stop_requested:
                self.stop_reason = "sigterm" if self._stop_requested else "peer"
                self.reporter.emit(records.Stopped(message="stopped on SIGTERM after a checkpoint"
                                           if self._stop_requested else
                                           "stopped with a participant that got SIGTERM",
                                           step=self.step))
                return True
        return False

    def _report_step(self, assignment: Assignment, result: StepResult,
                     throughput: float) -> None:
        if result.skipped is not None:  # a loss to chart it has not: an event instead
            self.reporter.emit(result.skipped.record(assignment.epoch + 1, self.skipped_steps))
        elif not math.isfinite(result.loss):
            # Gradients finite all the same: this pod's did not count (torchft's first step,
            # in which it only takes the first replica's weights).
            logger.warning("step %d: loss %s here, but not in the update", self.step,
                           result.loss)
        else:
            self.reporter.emit(records.Metric(
                step=self.step, epoch=assignment.epoch + 1, loss=result.loss,
                learning_rate=self.optimizer.param_groups[0]["lr"],
                samples_per_second=throughput, participants=self.group.participants,
                samples_seen=self.samples_seen))
        # A pipeline replica's stages train on the same samples: its last stage reports them.
        if self.config.runtime.log_sample_ids and (self.pipeline is None
                                                   or self.pipeline.stage.is_last):
            window = self.sampler.order(assignment.epoch)[
                assignment.cursor:assignment.cursor + assignment.window]
            self.reporter.emit(records.SampleIds(step=self.step, epoch=assignment.epoch + 1,
                                                 cursor=assignment.cursor, rank=self.group.rank,
                                                 ids=result.used.tolist(),
                                                 window=window.tolist()))
        self._log_progress(assignment, result, throughput)

    def _mark_ready(self) -> None:
        """This process participates in a step for the first time (it holds the live state and
        its step's group is formed): create the ready file. A migration then retires the pod's
        old incarnation, which is in this step's group too: it commits this step beside its
        replacement and leaves after it (make before break)."""
        self._ready = True
        ready = self.config.runtime.ready_file
        if ready is not None:
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.touch()

    def _join(self, first: Assignment) -> None:
        """This process took part in a committed step for the first time: say so."""
        self._joined = True
        self.reporter.emit(records.Joined(
            message=f"{self.reporter.pod} takes part from step {self.step}",
            pod=self.reporter.pod, step=self.step, epoch=first.epoch + 1,
            participants=self.group.participants,
            heal_bytes=int(self._heal.get("bytes", 0)),
            heal_seconds=float(self._heal.get("seconds", 0.0))))

    def _leave(self, last: Assignment) -> None:
        """Leave gracefully after the step just committed: the peers hold the same state and go
        on without this pod at once; the epoch end, if this step made one, is theirs."""
        self.group.leave()
        self.stop_reason = "left"
        self.reporter.emit(records.Left(message=f"{self.reporter.pod} left the job after step "
                                                f"{self.step}", pod=self.reporter.pod,
                                        step=self.step, epoch=last.epoch + 1))

    def _end_epoch(self, epoch: int) -> None:
        """Validation, the epoch-end checkpoint and event for `epoch` (counted from 0)."""
        self.metrics["validation"] = self.evaluate(self.validation_data, "validation")
        self.epoch_end_pending = False
        self.save_checkpoint(epoch_end=True)
        self.reporter.emit(records.EpochEnd(message=f"epoch {epoch + 1} done", epoch=epoch + 1,
                                    step=self.step))

    def _log_progress(self, assignment: Assignment, result: StepResult, throughput: float) -> None:
        now = time.monotonic()
        if now - self._last_log < LOG_EVERY_SECONDS and self.step > 1:
            return
        self._last_log = now
        total = self.config.spec.epochs * len(self.train_data)
        logger.info("step %d epoch %d/%d %.1f%% loss %.4f %.1f samples/s", self.step,
                    assignment.epoch + 1, self.config.spec.epochs,
                    100 * self.samples_seen / total, result.loss, throughput)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        logger.info("SIGTERM: stopping after the current step")
        self._stop_requested = True

    def _whole_model(self) -> nn.Module | None:
        """The model to export: a pipeline's is assembled from its stages on the primary
        (None on the other pods)."""
        if self.pipeline is None:
            if not self.lora:
                return self.model
            spec = self.config.spec
            return lora.merged(unwrap(self.model), spec,
                               resolve_model(spec.model, self.config.runtime.inputs_dir))
        state = self.pipeline.gather_state()
        if state is None:
            return None
        spec = self.config.spec
        whole = load_model(resolve_model(spec.model, self.config.runtime.inputs_dir), spec.seed)
        whole.load_state_dict(state)
        return whole

    def _save_shards(self, meta: dict[str, Any], report: Any) -> None:
        """A pipeline's checkpoint, at once: replica 0's stages each write their shard, then
        the primary completes it once all have (every pod passes the barrier)."""
        assert self.pipeline is not None
        runtime = self.config.runtime
        if self.group.rank == 0:
            checkpoint.save_shard(runtime.checkpoint_dir, self.step, self.pipeline.shard,
                                  self.pipeline.model_state(), self.state_dict())
        self.group.barrier()
        if self.group.is_primary:
            report(checkpoint.complete_shards(runtime.checkpoint_dir, self.step,
                                              self.pipeline.shards, meta,
                                              keep=self.config.spec.keep_checkpoints))

    def save_checkpoint(self, epoch_end: bool, emergency: bool = False) -> None:
        """Checkpoint the committed state: by the primary in the background, or at once by every
        survivor in an emergency."""
        if not (self.group.is_primary or emergency or self.pipeline):
            return
        # The epoch of the last committed step, counted from 1: after an epoch's last step the
        # sampler is at the next one's start already (an emergency save may come before the
        # epoch end is done).
        epoch = self.sampler.epoch + (1 if self.sampler.cursor else 0)
        spec = self.config.spec
        meta = {"epoch": epoch, "cursor": self.sampler.cursor, "epoch_end": epoch_end,
                "emergency": emergency, "finetune": spec.finetune,
                # A LoRA checkpoint holds the trainable part: the rest is this base model.
                "base_model": spec.model,
                "metrics": {"val_accuracy": self.metrics.get("validation", {}).get("accuracy")}}
        directory, step, keep = (self.config.runtime.checkpoint_dir, self.step,
                                 self.config.spec.keep_checkpoints)

        def reported(info: checkpoint.CheckpointInfo) -> None:
            size = store.size(info.path)
            self.reporter.emit(records.CheckpointSaved(step=step, epoch=epoch, path=info.path.name,
                                               size_bytes=size, epoch_end=epoch_end,
                                               val_accuracy=info.val_accuracy,
                                               emergency=emergency))
            self.reporter.flush()

        if self.pipeline is not None:
            self._save_shards(meta, reported)
            return
        if emergency:
            self.checkpoints.wait()
            reported(checkpoint.save_checkpoint(
                directory, step, self.model_state(), self.state_dict(), meta,
                keep=keep, shared=True))
            return
        model_state = checkpoint.cpu_copy(self.model_state())
        trainer_state = checkpoint.cpu_copy(self.state_dict())
        self.checkpoints.submit(lambda: checkpoint.save_checkpoint(
            directory, step, model_state, trainer_state, meta, keep=keep), reported)

    def save_emergency_checkpoint(self) -> None:
        """After a failed collective: keep the last committed step so a restart loses none.

        The model and optimizer change only when a step commits, so they hold that step's
        state whichever collective failed; every survivor writes, since any may be the lowest.
        """
        if self.step == 0:
            return
        try:
            self.save_checkpoint(epoch_end=False, emergency=True)
            logger.info("emergency checkpoint at step %d", self.step)
        except Exception:  # the failure being handled matters more; this one is logged
            logger.exception("emergency checkpoint at step %d failed", self.step)

    # --- evaluation ----------------------------------------------------------------------

    def evaluate(self, data: TokenizedSplit, split: records.EvalSplit) -> dict[str, Any]:
        """Evaluate on `split`, log and report it; the result with its epoch and step."""
        forward = self.pipeline.logits if self.pipeline else None
        result: dict[str, Any] = {**evaluate(unwrap(self.model), data, self.group,
                                             self.config.spec.eval_batch_size, forward),
                                  "epoch": self.sampler.epoch, "step": self.step}
        logger.info("%s: accuracy %.4f f1 %.4f loss %.4f (%d samples)", split,
                    result["accuracy"], result["f1"], result["loss"], result["samples"])
        self.reporter.emit(records.Evaluation(split=split, **result))
        return result

    def close(self) -> None:
        self.group.close()

