"""Recovery after killed pods: live (torchft) against restart (torchrun elastic), one run.

Both modes run the same jobs on the same machine through the real control plane and the local
backend; every kill is a real SIGKILL through `POST .../pods/{ordinal}/kill`.

1. Kills: pod 1 of 3 is killed every --every seconds, --kills times. Per kill: the survivors'
   pause (kill -> pod 0's first step committed after the group noticed the loss; a step still
   in flight with the dead pod's gradients does not count), the committed steps computed again
   (pod 0's last step committed before that moment minus the one committed then, plus one), and the
   rejoin time (recreated pod's start -> its first committed step; live pods start as the
   job's warm standby where one is loaded), and where that time goes, from the pods' own
   events (`breakdown`). The job's global batch is 24 samples a step whoever takes part, in
   shards of --shard samples: after a kill the survivors compute the dead pod's shards too, so
   finer shards spread them (8: one a pod, 4: two a pod). Goals: live pause <= the usual step
   (the median interval between the survivor's commits before the kill) + 0.25 s, live/restart
   pause ratio <= 0.15, 0 steps lost, live rejoin <= 1.5 s from a warm standby (median).
2. Chaos: the demo job (MiniLM, Rotten Tomatoes, 2,000 samples, 2 pods) once undisturbed, then
   with a pod killed every T seconds until it ends, same seed, for each T of --chaos-every from
   the longest down (60, 30, 20, 10, 5 s), until a run does not finish within --deadline
   seconds (it is cancelled then). The figure: for each mode, the shortest interval at which
   the job still finishes, with its test accuracy and time against the undisturbed run. Goals:
   live finishes with a kill every 10 s, restart every 30 s, each within 1 point of accuracy.

    PYTHONPATH=. .venv/bin/python -m bench.recovery [--kills 5] [--every 20] [--modes live,restart]
        [--parts kills,chaos] [--shard 8] [--chaos-every 60,30,20,10,5] [--deadline 900]
    # a smoke run of the figure: one short interval on a small sample
    PYTHONPATH=. .venv/bin/python -m bench.recovery --parts chaos --modes restart \
        --chaos-every 20 --samples 300 --deadline 300
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from api.cli.demo import DEMO_SPEC
from bench.control_plane import events, job_state, pod_state, serve, steps, wait

FINISHED = ("succeeded", "failed", "cancelled")


def kill(http: httpx.Client, data_dir: Path, job_id: str, ordinal: int) -> tuple[float, int]:
    """SIGKILL a pod through the API; (when the supervisor sent the signal, restarts before)."""
    before = pod_state(data_dir, job_id, ordinal)
    http.post(f"/api/v1/jobs/{job_id}/pods/{ordinal}/kill", json={"grace_seconds": 0})

    def signalled() -> float | None:
        pod = pod_state(data_dir, job_id, ordinal)
        if pod["restarts"] == before["restarts"]:
            return pod["signalled_at"] or None
        # Recreated already (a warm standby takes its place in the same tick): state.json
        # has the new incarnation's, so the time is the supervisor's log line of the kill.
        log = (data_dir / "jobs" / job_id / "supervisor.log").read_text().splitlines()
        return next((datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                     for line in reversed(log)
                     if f"kill: pod {pod['name']} (pid {before['pid']})" in line), None)

    return wait(signalled, 30, "the kill"), before["restarts"]


def recovery(committed: list[tuple[float, str, int, int]], pod: str, killed_at: float,
             joined: int | None = None) -> tuple[float, int, float]:
    """(time, step) of the survivor's first commit computed after the group noticed the kill,
    and the median interval between its last commits before the kill (the usual step).

    A step in flight may still commit just after the kill, with the dead pod's gradients: that
    is not recovery. Recovery is the first commit with another participant count (live: the
    survivors alone), of step `joined` or later (the first the recreated pod committed: live,
    the survivors' first quorum may take it in, with their count unchanged) or after a stall of
    over three usual step intervals (a restart).
    """
    times = [(t, step, n) for t, p, step, n in committed if p == pod]
    before = [(t, n) for t, _, n in times if t < killed_at][-11:]
    usual = statistics.median(b - a for (a, _), (b, _) in itertools.pairwise(before))
    for (previous, _, _), (t, step, participants) in itertools.pairwise(times):
        if t > killed_at and (participants != before[-1][1] or t - previous > 3 * usual
                              or (joined is not None and step >= joined)):
            return t, step, usual
    raise SystemExit("no recovery seen after the kill")


def breakdown(http: httpx.Client, job_id: str, victim: str, killed_at: float,
              recovered_at: float, started: float, rejoined: float) -> dict[str, float]:
    """Where a kill's time went, from the pods' own events: for the survivors, the kill to the
    primary's report of the new quorum (detection and quorum) and from there to their first
    commit (the group's reconfiguration and the step); for the recreated pod, its start to its
    heal's start (the standby's hand-over, joining a quorum), the heal's transfer, and its end
    to the pod's first commit. A part whose event is missing (restart mode has no quorums or
    heals) is left out."""
    reported = [e["data"] | {"time": e["time"]} for e in events(http, job_id, "job")]
    parts: dict[str, float] = {}
    quorum = min((e["time"] for e in reported if e.get("type") == "quorum"
                  and killed_at < e["time"] <= recovered_at), default=None)
    if quorum is not None:
        parts |= {"detect+quorum": quorum - killed_at, "first step": recovered_at - quorum}
    healed = next((e for e in reported if e.get("type") == "healed"
                   and e.get("target") == victim and e["time"] > started), None)
    if healed is not None:
        heal_start = healed["time"] - healed["seconds"]
        parts |= {"start to heal": heal_start - started, "heal": healed["seconds"],
                  "heal to step": rejoined - healed["time"]}
    return parts


class JobEnded(Exception):
    """The job finished while the bench waited for a kill's recovery."""


def while_running(http: httpx.Client, job_id: str, condition: Callable[[], Any]
                  ) -> Callable[[], Any]:
    """`condition`, raising JobEnded once it is false and the job has finished: its pods will
    not step again, so waiting on would only time out."""
    def checked() -> Any:
        if value := condition():
            return value
        status = http.get(f"/api/v1/jobs/{job_id}").json()["status"]
        if status in FINISHED:
            raise JobEnded(status)
        return value
    return checked


def recreated(data_dir: Path, job_id: str, restarts: int) -> Callable[[], float | None]:
    """When pod 1's incarnation after `restarts` started (None until there is one)."""
    def started() -> float | None:
        pod = pod_state(data_dir, job_id, 1)
        return pod["started_at"] if pod["restarts"] > restarts else None
    return started


def stepped(http: httpx.Client, job_id: str, pod: str, after: float,
            from_step: int = 0) -> Callable[[], bool]:
    """Whether `pod` has committed a step after `after`, numbered `from_step` or later."""
    return lambda: any(p == pod and t > after and step >= from_step
                       for t, p, step, _ in steps(http, job_id))


def run_kills(http: httpx.Client, data_dir: Path, spec: dict[str, Any],
              args: argparse.Namespace) -> list[dict[str, float]]:
    job_id = http.post("/api/v1/jobs", json=spec).json()["id"]
    victim, survivor = f"{job_id}-1", f"{job_id}-0"
    wait(lambda: http.get(f"/api/v1/jobs/{job_id}").json()["progress"]["step"] >= 3, 600,
         "training to start")
    kills: list[dict[str, float]] = []
    try:
        for _ in range(args.kills):
            time.sleep(args.every)
            if http.get(f"/api/v1/jobs/{job_id}").json()["status"] not in ("running", "degraded"):
                break
            standby = job_state(data_dir, job_id).get("standby") or {}
            killed_at, restarts = kill(http, data_dir, job_id, 1)
            try:
                started = wait(while_running(http, job_id, recreated(data_dir, job_id, restarts)),
                               120, "pod 1 to be recreated")
                warm = (standby.get("ready")
                        and pod_state(data_dir, job_id, 1)["pid"] == standby["pid"])
                wait(while_running(http, job_id, stepped(http, job_id, victim, started)), 300,
                     "the recreated pod's first step")
                # The survivor's own report of that step or a later one: where the recreated
                # pod joined the survivors' first quorum after the kill, their participant count
                # never changed, and that step is where recovery shows (reports leave a pod a
                # step after it commits, so the survivor's may still be on the way).
                joined = min(step for t, pod, step, _ in steps(http, job_id)
                             if t > started and pod == victim)
                wait(while_running(http, job_id, stepped(http, job_id, survivor, started,
                                                         joined)), 300,
                     "the survivor's report of the recreated pod's first step")
            except JobEnded as ended:
                print(f"  {spec['fault_tolerance']}: the job {ended} before kill "
                      f"{len(kills) + 1}'s recovery was seen: {len(kills)} kills measured "
                      f"(fewer --kills or a shorter --every fit in its epoch)", flush=True)
                break
            committed = steps(http, job_id)
            rejoined, joined = min((t, step) for t, pod, step, _ in committed
                                   if t > started and pod == victim)
            recovered_at, first_step, usual = recovery(committed, survivor, killed_at, joined)
            last_before = max(step for t, pod, step, _ in committed
                              if t < recovered_at and pod == survivor)
            parts = breakdown(http, job_id, victim, killed_at, recovered_at, started, rejoined)
            kills.append({"pause": recovered_at - killed_at, "step": usual,
                          "lost": max(0, last_before - first_step + 1),
                          "rejoin": rejoined - started, **parts})
            print(f"  {spec['fault_tolerance']}: kill {len(kills)}: pause "
                  f"{kills[-1]['pause']:.2f} s (usual step {usual:.2f} s), lost "
                  f"{kills[-1]['lost']}, rejoin "
                  f"{kills[-1]['rejoin']:.2f} s"
                  + (" (the warm standby)" if warm else " (a new process)")
                  + "".join(f"; {name} {value:.2f} s" for name, value in parts.items()),
                  flush=True)
    finally:  # its pods outlive the API
        http.post(f"/api/v1/jobs/{job_id}/cancel")
    return kills


def run_demo(http: httpx.Client, mode: str, kill_every: float | None, deadline: float,
             samples: int) -> dict[str, Any]:
    """The demo job to its end, killing pods 1, 0, 1, ... every `kill_every` seconds; cancelled
    (status `did not finish`) if it has not ended `deadline` seconds after its submission."""
    started = time.monotonic()
    spec = {**DEMO_SPEC, "fault_tolerance": mode, "max_train_samples": samples}
    job_id = http.post("/api/v1/jobs", json=spec).json()["id"]
    victims, next_kill, kills = itertools.cycle([1, 0]), None, 0
    while (job := http.get(f"/api/v1/jobs/{job_id}").json())["status"] not in FINISHED:
        if time.monotonic() - started > deadline:
            http.post(f"/api/v1/jobs/{job_id}/cancel")
            job["status"] = "did not finish"
            break
        if kill_every and job["status"] in ("running", "degraded"):
            next_kill = next_kill or time.monotonic() + kill_every
            if time.monotonic() >= next_kill:
                response = http.post(f"/api/v1/jobs/{job_id}/pods/{next(victims)}/kill",
                                     json={"grace_seconds": 0})
                kills += response.status_code == 202
                next_kill = time.monotonic() + kill_every
        time.sleep(0.2)
    progress = job["progress"]
    result = {"every": kill_every, "status": job["status"], "reason": job["reason"],
              "kills": kills, "seconds": time.monotonic() - started,
              "accuracy": job["metrics"].get("test_accuracy") if job["status"] == "succeeded"
              else None, "at": f"step {progress['step']}, epoch {progress['epoch']}"}
    print(f"  {mode} demo, {f'a kill every {kill_every:g} s' if kill_every else 'undisturbed'}: "
          f"{result}", flush=True)
    return result


def run_chaos(http: httpx.Client, mode: str, args: argparse.Namespace,
              ) -> list[dict[str, Any]]:
    """The undisturbed run, then one per kill interval, longest first, until one fails."""
    runs = [run_demo(http, mode, None, args.deadline, args.samples)]
    for every in sorted(args.chaos_every, reverse=True):
        runs.append(run_demo(http, mode, every, args.deadline, args.samples))
        if runs[-1]["status"] != "succeeded":
            break
    return runs


def report_kills(results: dict[str, list[dict[str, float]]]) -> None:
    results = {mode: kills for mode, kills in results.items() if kills}
    if not results:
        print("\nno kill was measured")
        return
    print("\n| mode | kills | survivors' pause (median) | usual step (median) | pause - step "
          "| steps lost per kill (max) | rejoin (median) |")
    print("|---|---|---|---|---|---|---|")
    excess = {mode: statistics.median(k["pause"] - k["step"] for k in kills)
              for mode, kills in results.items()}
    for mode, kills in results.items():
        pause, step = (statistics.median(k[name] for k in kills) for name in ("pause", "step"))
        print(f"| {mode} | {len(kills)} | {pause:.2f} s | {step:.2f} s | {excess[mode]:.2f} s | "
              f"{max(k['lost'] for k in kills)} | "
              f"{statistics.median(k['rejoin'] for k in kills):.2f} s |")
    if "live" in excess:
        print(f"\nlive pause over the usual step: {excess['live']:.2f} s (goal <= 0.25 s)")
    for mode, kills in results.items():
        names = [name for name in BREAKDOWN if all(name in k for k in kills)]
        if names:
            print(f"\n{mode}, where the time goes (median of the kills): " + ", ".join(
                f"{name} {statistics.median(k[name] for k in kills):.2f} s" for name in names))
    if {"live", "restart"} <= set(results):
        ratio = (statistics.median(k["pause"] for k in results["live"])
                 / statistics.median(k["pause"] for k in results["restart"]))
        print(f"\nlive/restart pause ratio: {ratio:.3f} (goal <= 0.15)")


BREAKDOWN = ("detect+quorum", "first step", "start to heal", "heal", "heal to step")
"""The parts of a kill's pause and of its rejoin (`breakdown`)."""
GOALS = {"live": 10.0, "restart": 30.0}
"""The kill interval (s) at which each mode's demo job must still finish."""


def chaos_row(mode: str, run: dict[str, Any], calm: dict[str, Any]) -> str:
    finished = run["accuracy"] is not None
    disturbed = run is not calm
    accuracy = f"{100 * run['accuracy']:.2f}%" if finished else "-"
    gap = (f"{100 * abs(run['accuracy'] - calm['accuracy']):.2f} pts"
           if finished and disturbed and calm["accuracy"] is not None else "")
    ratio = f"{run['seconds'] / calm['seconds']:.2f}" if finished and disturbed else ""
    status = run["status"]
    if status == "did not finish":
        status += f" ({run['at']})"
    every = f"{run['every']:g} s" if run["every"] else "undisturbed"
    return (f"| {mode} | {every} | {run['kills']} | {status} | {accuracy} | {gap} | "
            f"{run['seconds']:.0f} s | {ratio} |")


def report_chaos(results: dict[str, list[dict[str, Any]]]) -> None:
    print("\n| mode | a kill every | kills | status | test accuracy | gap | wall time "
          "| time / undisturbed |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, runs in results.items():
        for run in runs:
            print(chaos_row(mode, run, runs[0]))
    for mode, runs in results.items():
        done = [run["every"] for run in runs[1:] if run["accuracy"] is not None]
        shortest = f"{min(done):g} s" if done else "none"
        goal = f" (goal {GOALS[mode]:g} s)" if mode in GOALS else ""
        print(f"\n{mode}: shortest kill interval finished: {shortest}{goal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--every", type=float, default=20)
    parser.add_argument("--chaos-every", type=lambda text: [float(t) for t in text.split(",")],
                        default=[60.0, 30.0, 20.0, 10.0, 5.0],
                        help="kill intervals (s) of the chaos runs, tried longest first")
    parser.add_argument("--deadline", type=float, default=900,
                        help="seconds after which a demo run is cancelled as not finished")
    parser.add_argument("--samples", type=int, default=DEMO_SPEC["max_train_samples"],
                        help="the demo job's training samples (fewer: a quicker smoke run)")
    parser.add_argument("--modes", default="live,restart")
    parser.add_argument("--parts", default="kills,chaos")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--shard", type=int, choices=(1, 2, 3, 4, 6, 8, 12, 24), default=8,
                        help="the kill runs' samples per shard (batch_size) of the global 24")
    parser.add_argument("--data-dir", type=Path, help="keep jobs, logs and database here")
    args = parser.parse_args()
    modes, parts = args.modes.split(","), args.parts.split(",")
    spec = {"model": args.model, "dataset": "rotten_tomatoes", "replicas": 3,
            "epochs": 1, "batch_size": args.shard, "global_batch_size": 24,
            "checkpoint_every_steps": 20}
    kill_results: dict[str, list[dict[str, float]]] = {}
    chaos_results: dict[str, list[dict[str, Any]]] = {}
    with serve(args.data_dir) as (http, data_dir):
        for mode in modes if "kills" in parts else []:
            kill_results[mode] = run_kills(http, data_dir, {**spec, "fault_tolerance": mode}, args)
        for mode in modes if "chaos" in parts else []:
            chaos_results[mode] = run_chaos(http, mode, args)
    if kill_results:
        report_kills(kill_results)
    if chaos_results:
        report_chaos(chaos_results)


if __name__ == "__main__":
    main()
