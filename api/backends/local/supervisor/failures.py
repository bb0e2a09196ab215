"""What an ended pod means, and what follows: it left (recreated at once), finished training,
or failed (recreated alone, until the job gives up: api/backends/policy.py; at once by a live
job's warm standby, else after a backoff)."""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from api.backends.local.jobdir import signal_group, tail_lines
from api.backends.local.processes import STOP_GRACE_SECONDS, Pod
from api.backends.local.supervisor.scaling import drop_removed
from api.backends.policy import bad_input, bad_input_reason, budget_spent_reason, over_budget
from trainer.contract.process import ExitCode, failure_reason

if TYPE_CHECKING:
    from api.backends.local.supervisor.loop import Supervisor

logger = logging.getLogger(__name__)


def reap(supervisor: Supervisor) -> None:
    now = time.monotonic()
    standby = standby_ready(supervisor)  # the first pod found failed takes it at once
    for pod in supervisor.pods:
        if pod.process is None or (not pod.alive and pod.phase != "Running"):
            continue  # none yet, or its end was dealt with (one seen ended elsewhere is not)
        if not pod.process.poll():
            if pod.process.overdue(now):
                logger.warning("pod %s ignored SIGTERM: SIGKILL", pod.name)
            continue
        # The leader is gone; anything it left in its group must not outlive it.
        signal_group(pod.process.pid, signal.SIGKILL)
        pod.exit_code = pod.process.exit_code
        if not supervisor.live:  # its rendezvous node is dead, whatever it ended for
            supervisor.coordinator.forget_node(pod.name, pod.process.pid)
        if pod.replace_on_exit and supervisor.mode == "running":
            logger.info("pod %s stopped for its migration: starting its replacement",
                        pod.name)
            supervisor.start_pod(pod)
            continue
        if left(supervisor, pod):
            # Nothing failed: check_group recreates it at once, as Kubernetes replaces a
            # pod deleted gracefully, and no restart is counted.
            logger.info("pod %s left gracefully", pod.name)
            pod.phase = "Pending"
            continue
        pod.phase = "Succeeded" if done_training(supervisor, pod) else "Failed"
        logger.info("pod %s exited with code %s: %s", pod.name,
                    "unknown" if pod.exit_code is None else pod.exit_code, pod.phase)
        if pod.phase == "Failed":
            supervisor.coordinator.report_gone(pod.name, pod.incarnation, replaced=standby)
            standby = False
            stop_replica(supervisor, pod)
    drop_removed(supervisor)


def standby_ready(supervisor: Supervisor) -> bool:
    """Whether a failed pod is recreated at once: by the job's loaded standby (a live job's),
    while it trains."""
    standby = supervisor.standby
    return standby is not None and standby.ready and supervisor.mode == "running"


def stop_replica(supervisor: Supervisor, failed: Pod) -> None:
    """A live pipeline replica lives and dies whole: its other stage pods get SIGKILL at once
    and are recreated with it. Left alone, a stage that was waiting for the dead one in its
    replica's next quorum would wait out the quorum timeout (a minute) before it failed."""
    if supervisor.stages == 1:
        return
    replica = failed.ordinal // supervisor.stages
    for pod in supervisor.pods:
        if pod.ordinal // supervisor.stages == replica and pod.alive and pod.process is not None:
            logger.info("pod %s: its replica lost pod %s, so it stops too", pod.name,
                        failed.name)
            # Not stop_pod: it polls the process, and one seen ended there is never judged by
            # reap (a stage that died in the same moment would stay Running, never recreated).
            pod.signalled_at = pod.signalled_at or time.time()
            signal_group(pod.process.pid, signal.SIGKILL)


def left(supervisor: Supervisor, pod: Pod) -> bool:
    """Whether an ended pod left on a SIGTERM of this supervisor (a kill with a grace) and
    stopped cleanly: its peers train on, so it is recreated, not failed."""
    return pod.stopped and pod.exit_code == ExitCode.OK and supervisor.mode != "finishing"


def done_training(supervisor: Supervisor, pod: Pod) -> bool:
    """Whether an ended pod stopped because the job's training is over."""
    if pod.stopped:
        return False
    if pod.exit_code is not None:
        return pod.exit_code == ExitCode.OK
    # Adopted, so its exit status is unknown. A trainer exits 0 only at the end of the
    # job, once the model is exported (`config.json`, as the reconciler sees it) or just
    # before: check_group judges such a pod again until it would be recreated.
    return (supervisor.launch.model_dir / "config.json").is_file()


def check_group(supervisor: Supervisor) -> None:
    recreate_left(supervisor)
    for pod in supervisor.pods:
        if pod.phase == "Failed" and pod.exit_code is None and done_training(supervisor, pod):
            logger.info("pod %s: the model is exported, so it ended its training", pod.name)
            pod.phase, pod.restart_at = "Succeeded", None
    failed = [pod for pod in supervisor.pods if pod.phase == "Failed" and not pod.removing]
    if not failed:
        if all(pod.phase == "Succeeded" for pod in supervisor.pods if not pod.removing):
            supervisor.mode, supervisor.final_reason = "finishing", None
            for pod in supervisor.pods:  # a replacement still healing has nothing left to do
                supervisor.stop_pod(pod, STOP_GRACE_SECONDS)
        return
    bad = [p for p in failed if bad_input(p.exit_code) and not p.stopped]
    if bad:
        supervisor.stop_group("finishing", bad_input_reason(
            bad[0].name, last_error(supervisor, bad[0]), bad[0].exit_code))
    else:
        recreate_failed(supervisor, failed)


def recreate_left(supervisor: Supervisor) -> None:
    """Recreate the pods that left at once, unless the group finished training meanwhile
    (then a pod recreated would find no peer to join: it ended as they did)."""
    finished = any(pod.phase == "Succeeded" for pod in supervisor.pods)
    for pod in supervisor.pods:
        if pod.phase == "Pending" and pod.process is not None and not pod.alive:
            if finished:
                pod.phase = "Succeeded"
            else:
                supervisor.start_pod(pod)


def recreate_failed(supervisor: Supervisor, failed: list[Pod]) -> None:
    """Recreate each failed pod alone, after a backoff; the others carry on."""
    if any(pod.phase == "Succeeded" for pod in supervisor.pods):
        # A pod exits 0 only when the group finished training: a pod recreated now would
        # find no peer to join and train alone from an older checkpoint.
        if not any(pod.alive for pod in supervisor.pods):
            supervisor.mode, supervisor.final_reason = "finishing", None
        return
    now = time.monotonic()
    for pod in failed:
        if over_budget(pod.restarts + 1, supervisor.max_restarts):  # the restart it would take
            supervisor.stop_group("finishing", budget_spent_reason(
                pod.name, pod.restarts, pod.exit_code))
            return
        if pod.restart_at is None:
            # Loading a new standby takes longer than the backoff: a pod failing again and
            # again is recreated at once no more often than that.
            pod.restart_at = now + (0.0 if standby_ready(supervisor) else supervisor.backoff)
            logger.info("pod %s failed: recreating it", pod.name)
        if now >= pod.restart_at:
            pod.restart_at = None
            pod.restarts += 1
            supervisor.start_pod(pod)


def last_error(supervisor: Supervisor, pod: Pod) -> str | None:
    """The trainer's last error message in the pod's log (its launcher may log after it), else
    its last line."""
    return failure_reason(tail_lines(supervisor.job_dir.log(pod.name), 50))
