"""Recovery after a killed pod: live (torchft) against restart (whole group from a checkpoint).

Both modes run the same job on the same machine in one run, through the real control plane and
local backend: pod 1 is SIGKILLed every --every seconds, --kills times. Per kill it measures the
survivors' pause (kill -> next committed step of pod 0), the committed steps recomputed, and the
rejoin time (recreated pod's process start -> its first committed step). Prints medians per mode
and the live/restart ratio (goals: live pause <= 1.5 s, ratio <= 0.15, 0 steps lost, rejoin
<= 10 s).

    PYTHONPATH=. .venv/bin/python -m bench.recovery [--kills 5] [--every 20] [--model minilm]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.serve_noop import free_port

TOKEN = "bench-admin-token-0123456789"


def events(http: httpx.Client, job_id: str, kind: str) -> list[dict[str, Any]]:
    found, after = [], 0
    while True:
        page = http.get(f"/api/v1/jobs/{job_id}/events",
                        params={"after": after, "type": kind, "limit": 1000}).json()
        found += page["data"]
        if page["next_after"] is None:
            return found
        after = page["next_after"]


def wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def _recreated(state_file: Path, restarts: int) -> float | None:
    """The start time of pod 1's next incarnation, once there is one."""
    pod = json.loads(state_file.read_text())["pods"][1]
    return pod["started_at"] if pod["restarts"] > restarts else None


def _steps(http: httpx.Client, job_id: str, ordinal: int, since: float) -> list[dict[str, Any]]:
    """Committed-step metrics of one pod reported after `since`."""
    return [e for e in events(http, job_id, "metric") if e["data"].get("kind") == "metric"
            and e["data"]["pod"] == f"{job_id}-{ordinal}" and e["time"] > since]


def run_mode(http: httpx.Client, data_dir: Path, spec: dict[str, Any], args: argparse.Namespace,
             ) -> list[dict[str, float]]:
    job_id = http.post("/api/v1/jobs", json=spec).json()["id"]
    state_file = data_dir / "jobs" / job_id / "state.json"
    wait(lambda: http.get(f"/api/v1/jobs/{job_id}").json()["progress"]["step"] >= 3, 600,
         "training to start")
    kills = []
    for _ in range(args.kills):
        time.sleep(args.every)
        job = http.get(f"/api/v1/jobs/{job_id}").json()
        if job["status"] not in ("running", "degraded"):
            break
        before = max((e["data"]["step"] for e in events(http, job_id, "metric")
                      if e["data"].get("kind") == "metric"), default=0)
        restarts = json.loads(state_file.read_text())["pods"][1]["restarts"]
        killed_at = time.time()
        http.post(f"/api/v1/jobs/{job_id}/pods/1/kill", json={"grace_seconds": 0})
        started = wait(lambda r=restarts: _recreated(state_file, r), 120, "pod 1 to be recreated")
        survivor = wait(lambda t=killed_at: _steps(http, job_id, 0, t), 300,
                        "a committed step after the kill")
        rejoined = wait(lambda t=started: _steps(http, job_id, 1, t), 300,
                        "the recreated pod's first step")
        kills.append({"pause": survivor[0]["time"] - killed_at,
                      "lost": max(0, before - survivor[0]["data"]["step"] + 1),
                      "rejoin": rejoined[0]["time"] - started})
        print(f"  {spec['fault_tolerance']}: kill {len(kills)}: pause "
              f"{kills[-1]['pause']:.2f} s, lost {kills[-1]['lost']}, rejoin "
              f"{kills[-1]['rejoin']:.2f} s", flush=True)
    http.delete(f"/api/v1/jobs/{job_id}")
    return kills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--every", type=float, default=20)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    spec = {"model": args.model, "dataset": "rotten_tomatoes", "replicas": args.replicas,
            "epochs": 1, "batch_size": 8, "checkpoint_every_steps": 20}
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        port = free_port()
        env = {**os.environ, "MIGRATOR_DATA_DIR": scratch, "MIGRATOR_ADMIN_TOKEN": TOKEN,
               "MIGRATOR_RECONCILE_INTERVAL": "0.5"}
        server = subprocess.Popen([sys.executable, "-m", "api", "--port", str(port)], env=env,
                                  stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                              headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                wait(lambda: _healthy(http), 60, "the API")
                for mode in ("live", "restart"):
                    results[mode] = run_mode(http, Path(scratch), {**spec,
                                                                   "fault_tolerance": mode}, args)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    print("\n| mode | kills | survivors' pause (median) | steps lost per kill (max) "
          "| rejoin (median) |")
    print("|---|---|---|---|---|")
    for mode, kills in results.items():
        print(f"| {mode} | {len(kills)} | {statistics.median(k['pause'] for k in kills):.2f} s | "
              f"{max(k['lost'] for k in kills)} | "
              f"{statistics.median(k['rejoin'] for k in kills):.2f} s |")
    ratio = (statistics.median(k["pause"] for k in results["live"])
             / statistics.median(k["pause"] for k in results["restart"]))
    print(f"\nlive/restart pause ratio: {ratio:.3f} (goal <= 0.15)")


def _healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
