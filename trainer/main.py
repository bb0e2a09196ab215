"""Entry point: configure, train, report, clean up; exit codes in trainer.contract.process."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trainer.config import ConfigError, TrainConfig, load_config
from trainer.contract.process import ExitCode, log_format
from trainer.contract.records import Failed
from trainer.data import DataError
from trainer.distributed import Group, die_with_parent, show_stacks_on_request
from trainer.model import DeviceChoice, ModelError, choose_device
from trainer.nonfinite import NonFiniteLoss
from trainer.report import HeartbeatFile, HttpSink, JsonlSink, MetricsSink, Reporter

if TYPE_CHECKING:
    from trainer.prepare import Prepared

logger = logging.getLogger("trainer")


def configure_logging(job_id: str, pod: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format=log_format(job_id, pod))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars in pod logs are noise
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def build_reporter(config: TrainConfig, pod: str, environ: Mapping[str, str]) -> Reporter:
    runtime = config.runtime
    incarnation = runtime.incarnation or None
    if incarnation and "TORCHELASTIC_RUN_ID" in environ:
        # Torchrun restarts workers inside one pod incarnation: each worker is a new sender.
        incarnation = f"{incarnation}-{uuid.uuid4().hex[:6]}"
    reporter = Reporter(pod, incarnation)
    sinks: list[MetricsSink] = []
    if runtime.metrics_file is not None:
        sinks.append(JsonlSink(runtime.metrics_file, pod, reporter.incarnation))
    if runtime.report_url and runtime.report_token:
        sinks.append(HttpSink(runtime.report_url, runtime.report_token, pod,
                              reporter.incarnation, drain_seconds=runtime.report_drain_seconds))
    if runtime.heartbeat_file is not None:
        sinks.append(HeartbeatFile(runtime.heartbeat_file))
    reporter.sinks = sinks
    return reporter


def pod_device(environ: Mapping[str, str]) -> DeviceChoice:
    """The device this process trains on (its torchrun local rank's GPU, where there are)."""
    return choose_device(int(environ.get("LOCAL_RANK", "0")))


def make_group(config: TrainConfig, pod: str, environ: Mapping[str, str],
               device: DeviceChoice) -> Group:
    """A torchft replica group on `device` when the job is live and a lighthouse is given, else
    torchrun's (cut into pipelines for a pipeline job)."""
    runtime = config.runtime
    if config.spec.parallelism == "pipeline":
        ordinal = pod.rsplit("-", 1)[-1]
        if config.spec.fault_tolerance == "live" and runtime.lighthouse:
            from trainer.fault_tolerance.live_pipeline import LivePipelineGroup
            from trainer.pipeline import PipelineError

            if not ordinal.isdigit() or not runtime.replica_store:
                raise PipelineError("a live pipeline pod needs POD_NAME <job>-<ordinal> and "
                                  "REPLICA_STORE")
            return LivePipelineGroup(device, config.spec.pipeline_stages, int(ordinal),
                                     runtime.replica_store, pod=pod,
                                     lighthouse=runtime.lighthouse,
                                     address=runtime.pod_address,
                                     peer_secret=runtime.peer_secret,
                                     quorum_retries=runtime.quorum_retries,
                                     replica_file=runtime.replica_file)
        from trainer.pipeline_group import PipelineGroup

        return PipelineGroup(device, config.spec.pipeline_stages, environ,
                             address=runtime.pod_address, peer_secret=runtime.peer_secret,
                             ordinal=int(ordinal) if ordinal.isdigit() else None)
    if config.spec.fault_tolerance == "live" and runtime.lighthouse:
        from trainer.fault_tolerance.live import LiveGroup

        return LiveGroup(device, pod=pod, lighthouse=runtime.lighthouse,
                         address=runtime.pod_address, peer_secret=runtime.peer_secret,
                         quorum_retries=runtime.quorum_retries,
                         replica_file=runtime.replica_file)
    return Group(device, environ, address=runtime.pod_address, peer_secret=runtime.peer_secret)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ,
         prepared: Prepared | None = None) -> int:
    """Train as the pod the configuration names; `prepared`: what a standby loaded for it."""
    try:
        config = load_config(argv, environ)
    except ConfigError as exc:
        print(f"trainer: invalid configuration: {exc}", file=sys.stderr)  # noqa: T201
        return ExitCode.BAD_INPUT
    rank = int(environ.get("RANK", "0"))
    pod = config.runtime.pod_name or f"{config.runtime.job_id}-{rank}"
    configure_logging(config.runtime.job_id, pod)
    if "TORCHELASTIC_RUN_ID" in environ:
        die_with_parent()  # the agent is the pod: a worker must not outlive it
        show_stacks_on_request()
    reporter = build_reporter(config, pod, environ)
    group = None
    try:
        from trainer.prepare import prepared_for
        from trainer.train import Trainer

        # Loaded before the group is made: a live pod is heard from as its group starts, and
        # its peers' next quorum waits up to the join timeout for a pod heard from moments ago
        # (trainer.fault_tolerance.lighthouse), which a pod still loading would cost them.
        device = pod_device(environ)
        prepared = prepared_for(config, device.device, prepared)
        group = make_group(config, pod, environ, device)
        trainer = Trainer(config, group, reporter, prepared)
        trainer.train()
        if trainer.stop_reason == "peer":
            return ExitCode.PEER_STOPPED
    except (DataError, ModelError) as exc:
        logger.error("%s", exc)
        reporter.emit(Failed(message=str(exc), reason="bad_input"))
        return ExitCode.BAD_INPUT
    except NonFiniteLoss as exc:  # a restart would compute the same value again
        logger.error("%s", exc)
        reporter.emit(Failed(message=str(exc), reason="non_finite_loss"))
        return ExitCode.BAD_INPUT
    except Exception as exc:
        logger.exception("training failed")
        reporter.emit(Failed(message=f"{type(exc).__name__}: {exc}", reason="error"))
        return ExitCode.FAILED
    else:
        return ExitCode.OK
    finally:
        reporter.close()
        if group is not None:
            group.close()

