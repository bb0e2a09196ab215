"""A job's detached supervisor: kubelet + pod controller of the local backend.

Run as `python -m api.backends.local.supervisor <job_dir>`. It starts the job's coordinator (the
torchft lighthouse of a live job, the rendezvous store of a restart job) and one process group
per pod with a stable ordinal, recreates a pod that failed (after a short backoff) while the
others carry on, restarts the coordinator if it dies, obeys the kill, scale, migrate and delete
commands dropped into `commands/`, and records everything in `state.json` (replaced atomically)
so that any API process can observe and re-adopt the job. Recovery inside the group is the
pods' business: live pods heal from a peer, restart pods are restarted by their torchrun agents
from the newest checkpoint. A live job's supervisor also keeps a warm standby (standby.py) that
the next pod to start becomes, and tells the lighthouse at once when a pod dies.

With `--adopt` it takes over from a supervisor that died, as a restarted kubelet re-adopts its
containers: the pods and coordinator listed in `state.json` that still run go on untouched.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType

import grpc
import psutil

from api.backends import programs
from api.backends.local.jobdir import (
    CoordinatorRecord,
    DeleteCommand,
    JobDir,
    KillCommand,
    LaunchDocument,
    MigrateCommand,
    Mode,
    StateDocument,
    UnreadableDocument,
    pending_commands,
    read_command,
    read_launch,
    read_state,
    signal_group,
    tail_lines,
    try_lock,
    write_state,
)
from api.backends.local.processes import POLL_SECONDS, Adopted, Extra, Pod, Watched, spawn
from api.backends.local.standby import SETTLE_SECONDS, Standby
from trainer.contract.process import ExitCode, failure_reason
from trainer.contract.spec import stages_of
from trainer.contract.store import STORE_VARIABLES
from trainer.engine import lighthouse

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 10.0
LIGHTHOUSE_TIMEOUT = 1.0
"""Seconds a call to the lighthouse may take (it answers in milliseconds when it runs)."""
LOCK_WAIT_SECONDS = 1.0

SETTINGS_PREFIX = "MIGRATOR_"  # api.settings.Settings' env prefix


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((programs.LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def inherited_env(store_credentials: bool) -> dict[str, str]:
    """This supervisor's environment without the control plane's own settings (its admin
    token, database URL): a job's processes hold only their job's secrets; without the artifact
    store's credentials unless `store_credentials` (a job with its own gets that instead)."""
    withheld = (SETTINGS_PREFIX, *(() if store_credentials else STORE_VARIABLES))
    return {k: v for k, v in os.environ.items() if not k.startswith(withheld)}


class Supervisor:
    def __init__(self, job_dir: JobDir, document: LaunchDocument,
                 previous: StateDocument | None = None) -> None:
        self.job_dir, self.launch = job_dir, document.launch
        self.job_id = self.launch.job_id
        self.max_restarts, self.backoff = document.max_restarts, document.restart_backoff
        self.replicas = self.launch.replicas
        """The pods asked for: the launch's, until the job is scaled."""
        self.issued = 0
        """The highest incarnation number started (StateDocument.issued)."""
        self.pods = [Pod(i, f"{self.job_id}-{i}") for i in range(self.replicas)]
        self.live = self.launch.fault_tolerance == "live"
        self.coordinator: Watched | None = None
        """The torchft lighthouse (live) or the rendezvous store (restart), on a fixed port."""
        self.coordinator_endpoint = programs.Endpoint(programs.LOOPBACK, free_port())
        self.coordinator_starts = 0
        self.started = psutil.Process().create_time()
        self.mode: Mode = "running"
        self.final_reason: str | None = None
        self.finished = False
        self.reason: str | None = None
        self.adoptions = 0
        self.previous = previous
        """The state a dead supervisor left, to adopt its processes from."""
        stages = stages_of(self.launch.spec)
        self.stages = stages if self.live else 1
        """Pods per torchft replica group: a live pipeline's stages."""
        self.replica_ports = ([free_port() for _ in range(self.replicas // stages)]
                              if self.stages > 1 else [])
        """Where each replica of a live pipeline meets (its stage 0 hosts the store)."""
        # A standby is any pod's; a pipeline pod holds one stage and meets its replica first.
        self.standby = (Standby(job_dir) if self.live and document.standby and self.stages == 1
                        else None)
        """The warm process the next pod to start becomes (live jobs)."""
        self.warm_workers = document.standby
        """Whether restart-mode pods keep a warm worker for their next round."""
        self._sigterm = False
        self._written: StateDocument | None = None

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.previous is not None:
            self.adopt(self.previous)
        self.write_state()
        try:
            self.ensure_coordinator()
            for pod in self.pods:
                if pod.phase == "Pending" and self.mode == "running":
                    self.start_pod(pod, first=pod.started_at is None and self.previous is None)
            while not self.finished:
                time.sleep(POLL_SECONDS)
                self.tick()
        finally:
            self.kill_leftovers()
        logger.info("finished (%s)", self.reason or "every pod succeeded")
        return 0

    def adopt(self, previous: StateDocument) -> None:
        """Take over the pods and coordinator of a dead supervisor as its state lists them."""
        self.adoptions = previous.adoptions + 1
        self.mode, self.final_reason = previous.mode, previous.final_reason
        self.replicas = previous.replicas or self.replicas
        self.replica_ports = previous.replica_ports or self.replica_ports
        self.issued = max([previous.issued, *(record.incarnation for record in previous.pods),
                           *(extra.incarnation for record in previous.pods
                             for extra in (record.surge, record.retiring) if extra)])
        records = {record.ordinal: record for record in previous.pods}
        ordinals = sorted(set(records) | set(range(self.replicas)))
        self.pods = [Pod(ordinal, f"{self.job_id}-{ordinal}") for ordinal in ordinals]
        for pod in self.pods:
            if pod.ordinal in records:
                pod.adopt(records[pod.ordinal], STOP_GRACE_SECONDS)
        coordinator = previous.coordinator
        if coordinator is not None:
            # The pods know the coordinator by this endpoint: a new one must listen there too.
            self.coordinator_endpoint = programs.Endpoint.parse(coordinator.endpoint)
            self.coordinator_starts = coordinator.restarts + 1
            if coordinator.pid is not None:
                self.coordinator = Adopted(coordinator.pid, coordinator.pid_started)
        Standby.discard(previous.standby)
        logger.warning("adopting the job from supervisor pid %s (adoption %d): pods %s",
                       previous.supervisor_pid, self.adoptions,
                       ", ".join(f"{p.name} pid {p.process.pid}" for p in self.pods
                                 if p.process is not None) or "none running")

    def tick(self) -> None:
        if self._sigterm:
            logger.info("SIGTERM: stopping like a delete")
            self._sigterm = False
            self.stop_group("finishing", "deleted")
        self.run_commands()
        self.reap()
        self.reap_extras()
        self.promote_replacements()
        self.ensure_coordinator()
        if self.mode == "running":
            self.check_group()
        elif all(process.poll() for pod in self.pods for process in pod.processes):
            self.finished, self.reason = True, self.final_reason
        self.keep_standby()
        self.write_state()

    def state(self) -> StateDocument:
        coordinator = self.coordinator
        return StateDocument(
            supervisor_pid=os.getpid(), supervisor_started=self.started,
            finished=self.finished, reason=self.reason,
            pods=[pod.record() for pod in self.pods],
            coordinator=CoordinatorRecord(
                name="lighthouse" if self.live else "store",
                endpoint=str(self.coordinator_endpoint),
                pid=coordinator.pid if coordinator else None,
                pid_started=coordinator.started if coordinator else None,
                restarts=max(self.coordinator_starts - 1, 0)),
            mode=self.mode, final_reason=self.final_reason, adoptions=self.adoptions,
            replicas=self.replicas, issued=self.issued, replica_ports=self.replica_ports,
            standby=self.standby.record() if self.standby else None)

    def write_state(self) -> None:
        """Write state.json when it changed since the last write."""
        state = self.state()
        if state != self._written:
            write_state(self.job_dir, state)
            self._written = state

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._sigterm = True  # acted on by the loop: a handler must not touch the pods' state

    def ensure_coordinator(self) -> None:
        """Start the job's lighthouse or store, or restart it on the same port if it ended."""
        if self.mode == "finishing" or (
                self.coordinator is not None and not self.coordinator.poll()):
            return
        name = "lighthouse" if self.live else "store"
        if self.coordinator is not None:
            code = self.coordinator.exit_code
            logger.warning("%s exited with code %s: restarting it", name,
                           "unknown" if code is None else code)
        endpoint = self.coordinator_endpoint
        argv = (programs.lighthouse_argv(endpoint.host, endpoint.port, python=sys.executable)
                if self.live else
                programs.store_argv(endpoint.port, python=sys.executable, host=endpoint.host))
        self.coordinator = spawn(argv, self.job_dir.path, self.job_dir.log(name),
                                 env={**inherited_env(store_credentials=False),
                                      **programs.coordinator_env(self.launch)})
        self.coordinator_starts += 1
        logger.info("%s on %s (pid %d)", name, endpoint, self.coordinator.pid)
        self.write_state()  # listed at once: should this supervisor die, it is found again

    def next_incarnation(self) -> int:
        self.issued += 1
        return self.issued

    def start_pod(self, pod: Pod, first: bool = False) -> None:
        """Start the pod's process: incarnation 0 at the job's launch, a new number after."""
        pod.incarnation = 0 if first else self.next_incarnation()
        pod.process = self.spawn_pod(pod, pod.incarnation)
        pod.phase, pod.started_at = "Running", time.time()
        pod.signalled_at, pod.replace_on_exit = None, False
        logger.info("pod %s started: pid %d, incarnation %d, restarts %d", pod.name,
                    pod.process.pid, pod.incarnation, pod.restarts)
        self.write_state()  # listed at once: should this supervisor die, it is found again

    def spawn_pod(self, pod: Pod, incarnation: int) -> Watched:
        """Start one process group of `pod` as its `incarnation`: the standby, if one runs."""
        ready = self.job_dir.ready(pod.name, incarnation)
        ready.unlink(missing_ok=True)
        env = self.pod_env(pod.name, str(incarnation), ready,
                           self.job_dir.replica(pod.name, incarnation), pod.ordinal)
        log = self.job_dir.log(pod.name)
        if self.standby is not None and (process := self.standby.take(env, log)) is not None:
            return process
        argv = programs.pod_argv(self.launch, self.coordinator_endpoint, programs.LOOPBACK,
                                 python=sys.executable)
        return spawn(argv, self.job_dir.path, log, env)

    def pod_env(self, name: str, incarnation: str, ready: Path | None,
                replica: Path | None = None, ordinal: int | None = None) -> dict[str, str]:
        """A pod's environment (the standby's: no name, incarnation or ready file)."""
        store = None
        if self.replica_ports and ordinal is not None:
            store = str(programs.Endpoint(programs.LOOPBACK,
                                          self.replica_ports[ordinal // self.stages]))
        threads = (os.cpu_count() or 1) // max(self.replicas, 1)
        inherited = inherited_env(store_credentials=not self.launch.store_env)
        return {**inherited, **programs.pod_env(self.launch, name, self.coordinator_endpoint,
                                                programs.LOOPBACK, threads,
                                                incarnation=incarnation, ready_file=ready,
                                                replica_file=replica, replica_store=store,
                                                warm_worker=self.warm_workers)}

    def keep_standby(self) -> None:
        """Keep a standby warm while the job runs, started once the job is quiet: every pod
        participates (its ready file exists), the last one SETTLE_SECONDS ago or more."""
        if self.standby is None:
            return
        if self.mode != "running":
            self.standby.stop()
            return
        if self.standby.may_start() and self.quiet(time.time()):
            self.standby.start(self.pod_env("", "", None))

    def quiet(self, now: float) -> bool:
        for pod in self.pods:
            if pod.removing:
                continue
            if not pod.alive or pod.surge is not None or pod.retiring is not None:
                return False
            try:
                took_part = self.job_dir.ready(pod.name, pod.incarnation).stat().st_mtime
            except OSError:
                return False
            if now - took_part < SETTLE_SECONDS:
                return False
        return True

    def pod(self, ordinal: int) -> Pod | None:
        return next((pod for pod in self.pods if pod.ordinal == ordinal), None)

    def run_commands(self) -> None:
        for path in pending_commands(self.job_dir):
            try:
                command = read_command(path)
            except UnreadableDocument as exc:
                logger.warning("command ignored: %s", exc)
                continue
            finally:
                path.unlink(missing_ok=True)  # a command runs once, even one that failed
            if isinstance(command, DeleteCommand):
                logger.info("delete requested")
                self.stop_group("finishing", "deleted")
            elif isinstance(command, KillCommand):
                self.kill(command.ordinal, command.grace_seconds)
            elif isinstance(command, MigrateCommand):
                self.migrate(command.ordinal)
            else:
                self.scale(command.replicas)

    def kill(self, ordinal: int, grace: float) -> None:
        pod = self.pod(ordinal)
        if pod is None or pod.process is None or not pod.alive:
            logger.warning("kill: no running pod with ordinal %r; ignored", ordinal)
            return
        logger.info("kill: pod %s (pid %d), grace %.1f s", pod.name, pod.process.pid, grace)
        self.signal_pod(pod, grace)

    def scale(self, replicas: int) -> None:
        """Run `replicas` pods: start the missing ordinals, stop the highest ones gracefully
        (each leaves after its step; it is dropped, not recreated, once it has ended)."""
        if self.mode == "finishing":
            logger.warning("scale to %d ignored: the job is finishing", replicas)
            return
        logger.info("scale: %d -> %d pods", self.replicas, replicas)
        self.replicas = replicas
        for pod in self.pods:
            if pod.ordinal >= replicas and not pod.removing:
                pod.removing = True
                self.stop_pod(pod, STOP_GRACE_SECONDS)
            elif pod.ordinal < replicas and pod.removing:
                pod.removing = False  # stopped already: it leaves and is recreated
        for ordinal in range(replicas):
            if self.pod(ordinal) is None:
                pod = Pod(ordinal, f"{self.job_id}-{ordinal}")
                self.pods.append(pod)
                self.start_pod(pod)
        self.pods.sort(key=lambda pod: pod.ordinal)

    def migrate(self, ordinal: int) -> None:
        """Replace the pod's process by a new incarnation. Live: make before break, the new
        one starts beside the old and heals from a peer; once the new one participates in a
        step, the old one commits that step beside it and leaves (promote_replacements).
        Restart mode has no room for two: the old one stops (an emergency checkpoint) and the
        new one starts as soon as it ended."""
        pod = self.pod(ordinal)
        if pod is None or pod.removing or not pod.alive or self.mode == "finishing":
            logger.warning("migrate: no running pod with ordinal %r; ignored", ordinal)
            return
        if pod.surge is not None or pod.replace_on_exit:
            logger.warning("migrate: pod %s is already migrating; ignored", pod.name)
            return
        if not self.live:
            logger.info("migrate: stopping pod %s, its replacement starts when it ended",
                        pod.name)
            pod.replace_on_exit = True
            self.signal_pod(pod, STOP_GRACE_SECONDS)
            return
        incarnation = self.next_incarnation()
        pod.surge = Extra(self.spawn_pod(pod, incarnation), incarnation, time.time())
        logger.info("migrate: pod %s incarnation %d starts beside incarnation %d (pid %d)",
                    pod.name, incarnation, pod.incarnation, pod.surge.process.pid)
        self.write_state()

    def promote_replacements(self) -> None:
        """A replacement that participates in a step becomes its pod; the old process leaves."""
        for pod in self.pods:
            surge = pod.surge
            if surge is None or not self.job_dir.ready(pod.name, surge.incarnation).exists():
                continue
            if pod.process is not None and pod.alive:
                pod.retiring = Extra(pod.process, pod.incarnation, pod.started_at or 0.0)
                pod.process.stop(STOP_GRACE_SECONDS)
            pod.process, pod.incarnation, pod.started_at = (surge.process, surge.incarnation,
                                                            surge.started_at)
            pod.surge, pod.signalled_at = None, None
            pod.phase, pod.exit_code = "Running", None
            logger.info("migrate: pod %s incarnation %d takes part; incarnation %s leaves",
                        pod.name, surge.incarnation,
                        pod.retiring.incarnation if pod.retiring else "none")

    def reap_extras(self) -> None:
        """End what is left of replacements and leaving incarnations that ended; SIGKILL the
        ones past their grace."""
        now = time.monotonic()
        for pod in self.pods:
            for extra in (pod.surge, pod.retiring):
                if extra is None:
                    continue
                if extra.process.poll():
                    signal_group(extra.process.pid, signal.SIGKILL)
                    if extra is pod.surge:
                        pod.surge = None
                        self.report_gone(pod, extra.incarnation)
                        logger.warning("migrate: the replacement of pod %s exited with code %s "
                                       "before it took part; the pod runs on as it was",
                                       pod.name, extra.process.exit_code)
                    else:
                        pod.retiring = None
                        logger.info("pod %s incarnation %d has left (exit code %s)", pod.name,
                                    extra.incarnation, extra.process.exit_code)
                elif extra.process.overdue(now):
                    logger.warning("pod %s incarnation %d ignored SIGTERM: SIGKILL", pod.name,
                                   extra.incarnation)

    def stop_pod(self, pod: Pod, grace: float) -> None:
        """Stop every process group of the pod: its current one and any migration's."""
        self.signal_pod(pod, grace)
        for extra in (pod.surge, pod.retiring):
            if extra is not None:
                extra.process.stop(grace)

    def signal_pod(self, pod: Pod, grace: float) -> None:
        """SIGTERM its group now and SIGKILL it after `grace` seconds (at once for 0)."""
        if pod.process is None or not pod.alive:
            return
        pod.signalled_at = pod.signalled_at or time.time()
        pod.process.stop(grace)

    def stop_group(self, mode: Mode, reason: str | None) -> None:
        """Stop every live pod (SIGTERM, SIGKILL after the grace) and then finish."""
        if self.mode == "finishing":
            return  # the first reason to finish wins; the pods are already being stopped
        self.mode, self.final_reason = mode, reason
        for pod in self.pods:
            self.stop_pod(pod, STOP_GRACE_SECONDS)

    def reap(self) -> None:
        now = time.monotonic()
        for pod in self.pods:
            if pod.process is None or not pod.alive:
                continue
            if not pod.process.poll():
                if pod.process.overdue(now):
                    logger.warning("pod %s ignored SIGTERM: SIGKILL", pod.name)
                continue
            # The leader is gone; anything it left in its group must not outlive it.
            signal_group(pod.process.pid, signal.SIGKILL)
            pod.exit_code = pod.process.exit_code
            if pod.replace_on_exit and self.mode == "running":
                logger.info("pod %s stopped for its migration: starting its replacement",
                            pod.name)
                self.start_pod(pod)
                continue
            if self.left(pod):
                # Nothing failed: check_group recreates it at once, as Kubernetes replaces a
                # pod deleted gracefully, and no restart is counted.
                logger.info("pod %s left gracefully", pod.name)
                pod.phase = "Pending"
                continue
            pod.phase = "Succeeded" if self.done_training(pod) else "Failed"
            if pod.phase == "Failed":
                self.report_gone(pod, pod.incarnation)
            logger.info("pod %s exited with code %s: %s", pod.name,
                        "unknown" if pod.exit_code is None else pod.exit_code, pod.phase)
        self.drop_removed()

    def report_gone(self, pod: Pod, incarnation: int) -> None:
        """Tell a live job's lighthouse that this incarnation died, so its peers' next quorum
        forms without waiting for its heartbeats to expire (a pod that leaves says so itself)."""
        replica = self.job_dir.replica(pod.name, incarnation)
        try:
            replica_id = replica.read_text().strip()
        except OSError:
            return  # it died before it joined: the lighthouse never knew it
        replica.unlink(missing_ok=True)  # written by live pods only
        if not replica_id:
            return
        try:
            lighthouse.leave(f"http://{self.coordinator_endpoint}", replica_id,
                             timeout=LIGHTHOUSE_TIMEOUT)
        except grpc.RpcError as exc:  # its heartbeats expire all the same
            logger.warning("could not tell the lighthouse that %s is gone: %s", replica_id,
                           exc.code() if isinstance(exc, grpc.Call) else exc)
            return
        logger.info("told the lighthouse that %s (pod %s incarnation %d) is gone", replica_id,
                    pod.name, incarnation)

    def drop_removed(self) -> None:
        """Pods scaled away are gone once none of their processes runs."""
        for pod in [pod for pod in self.pods if pod.removing]:
            if all(process.poll() for process in pod.processes):
                logger.info("pod %s removed (scaled to %d)", pod.name, self.replicas)
                self.pods.remove(pod)

    def left(self, pod: Pod) -> bool:
        """Whether an ended pod left on a SIGTERM of this supervisor (a kill with a grace) and
        stopped cleanly: its peers train on, so it is recreated, not failed."""
        return pod.stopped and pod.exit_code == ExitCode.OK and self.mode != "finishing"

    def done_training(self, pod: Pod) -> bool:
        """Whether an ended pod stopped because the job's training is over."""
        if pod.stopped:
            return False
        if pod.exit_code is not None:
            return pod.exit_code == ExitCode.OK
        # Adopted, so its exit status is unknown. A trainer exits 0 only at the end of the
        # job, once the model is exported (`config.json`, as the reconciler sees it) or just
        # before: check_group judges such a pod again until it would be recreated.
        return (self.launch.model_dir / "config.json").is_file()

    def check_group(self) -> None:
        self.recreate_left()
        for pod in self.pods:
            if pod.phase == "Failed" and pod.exit_code is None and self.done_training(pod):
                logger.info("pod %s: the model is exported, so it ended its training", pod.name)
                pod.phase, pod.restart_at = "Succeeded", None
        failed = [pod for pod in self.pods if pod.phase == "Failed" and not pod.removing]
        if not failed:
            if all(pod.phase == "Succeeded" for pod in self.pods if not pod.removing):
                self.mode, self.final_reason = "finishing", None
                for pod in self.pods:  # a replacement still healing has nothing left to do
                    self.stop_pod(pod, STOP_GRACE_SECONDS)
            return
        bad = [p for p in failed if p.exit_code == ExitCode.BAD_INPUT and not p.stopped]
        if bad:
            self.stop_group("finishing", f"pod {bad[0].name} failed: bad input: "
                                         f"{self.last_log_line(bad[0])}")
        else:
            self.recreate_failed(failed)

    def recreate_left(self) -> None:
        """Recreate the pods that left at once, unless the group finished training meanwhile
        (then a pod recreated would find no peer to join: it ended as they did)."""
        finished = any(pod.phase == "Succeeded" for pod in self.pods)
        for pod in self.pods:
            if pod.phase == "Pending" and pod.process is not None and not pod.alive:
                if finished:
                    pod.phase = "Succeeded"
                else:
                    self.start_pod(pod)

    def recreate_failed(self, failed: list[Pod]) -> None:
        """Recreate each failed pod alone, after a backoff; the others carry on."""
        if any(pod.phase == "Succeeded" for pod in self.pods):
            # A pod exits 0 only when the group finished training: a pod recreated now would
            # find no peer to join and train alone from an older checkpoint.
            if not any(pod.alive for pod in self.pods):
                self.mode, self.final_reason = "finishing", None
            return
        now = time.monotonic()
        for pod in failed:
            if pod.restarts >= self.max_restarts:
                self.stop_group("finishing", f"restart budget spent: pod {pod.name} restarted "
                                             f"{pod.restarts} times, last exit code "
                                             f"{pod.exit_code}")
                return
            if pod.restart_at is None:
                pod.restart_at = now + self.backoff
                logger.info("pod %s failed: recreating it", pod.name)
            elif now >= pod.restart_at:
                pod.restart_at = None
                pod.restarts += 1
                self.start_pod(pod)

    def last_log_line(self, pod: Pod) -> str:
        """The trainer's last error message (its launcher may log after it), else the last line."""
        lines = tail_lines(self.job_dir.log(pod.name), 50)
        return failure_reason(lines) or f"exit code {pod.exit_code}"

    def kill_leftovers(self) -> None:
        """Never leave an orphan pod, standby or coordinator, whatever ended the loop."""
        if self.standby is not None:
            self.standby.stop()
        if self.coordinator is not None and not self.coordinator.poll():
            signal_group(self.coordinator.pid, signal.SIGKILL)
            self.coordinator.wait(timeout=STOP_GRACE_SECONDS)
        for pod in self.pods:
            for process in pod.processes:
                if not process.poll():
                    logger.warning("pod %s (pid %d) still running at exit: SIGKILL", pod.name,
                                   process.pid)
                    signal_group(process.pid, signal.SIGKILL)
                    process.wait(timeout=STOP_GRACE_SECONDS)
            if pod.process is not None and pod.phase == "Running":
                pod.exit_code, pod.phase = pod.process.exit_code, "Failed"
        if not self.finished:
            self.finished, self.reason = True, self.reason or "supervisor stopped unexpectedly"
        self.write_state()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m api.backends.local.supervisor",
                                     description="Supervise one job of the local backend.")
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--adopt", action="store_true",
                        help="take over the processes of the job's dead supervisor")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job_dir = JobDir(args.job_dir.absolute())
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, force=True,
        format=f"%(asctime)s %(levelname)s job={job_dir.job_id} supervisor: %(message)s")
    # Held for the supervisor's life: one per job directory. A backend that checks whether the
    # lock is held holds it for an instant: worth a short wait.
    lock = try_lock(job_dir, wait=LOCK_WAIT_SECONDS)
    if lock is None:
        logger.error("another supervisor already runs in %s", job_dir.path)
        return 1
    try:
        document = read_launch(job_dir)
        previous = read_state(job_dir) if args.adopt else None
    except UnreadableDocument as exc:
        logger.error("%s", exc)
        return 1
    if document is None or (args.adopt and (previous is None or previous.finished)):
        logger.error("nothing to %s in %s", "adopt" if args.adopt else "launch", job_dir.path)
        return 1
    supervisor = Supervisor(job_dir, document, previous)
    try:
        return supervisor.run()
    except Exception as exc:
        logger.exception("supervisor failed")
        supervisor.reason = f"supervisor failed: {type(exc).__name__}: {exc}"
        supervisor.finished = True
        supervisor.write_state()
        return 1


if __name__ == "__main__":
    sys.exit(main())
