"""What the benchmarks share: the real control plane (`python -m api`, local backend) on a free
port with a scratch data dir, and reading back what a job's pods reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.serve_noop import free_port

TOKEN = "bench-admin-token-0123456789"


_fetched: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
"""Every event read so far, by (API, job, type): a job's events are only ever appended."""


def events(http: httpx.Client, job_id: str, kind: str) -> list[dict[str, Any]]:
    """The job's events of type `kind`, oldest first. Only those after the last one read are
    asked for: benchmarks poll these several times a second, and the API serialising a job's
    whole history each time would take CPU from the pods being measured."""
    found = _fetched.setdefault((str(http.base_url), job_id, kind), [])
    after = found[-1]["id"] if found else 0
    while True:
        page = http.get(f"/api/v1/jobs/{job_id}/events",
                        params={"after": after, "type": kind, "limit": 1000}).json()
        found += page["data"]
        if page["next_after"] is None:
            return list(found)
        after = page["next_after"]


def wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def steps(http: httpx.Client, job_id: str) -> list[tuple[float, str, int, int]]:
    """(trainer time, pod, step, participants) of every committed step, oldest first."""
    return sorted((e["time"], e["data"]["pod"], e["data"]["step"], e["data"]["participants"])
                  for e in events(http, job_id, "metric") if e["data"].get("kind") == "metric")


def job_state(data_dir: Path, job_id: str) -> dict[str, Any]:
    """The job's state.json, as its local supervisor wrote it."""
    state: dict[str, Any] = json.loads((data_dir / "jobs" / job_id / "state.json").read_text())
    return state


def pod_state(data_dir: Path, job_id: str, ordinal: int) -> dict[str, Any]:
    """One pod's entry in state.json: its current incarnation's pid, start, restarts."""
    pod: dict[str, Any] = job_state(data_dir, job_id)["pods"][ordinal]
    return pod


def standby_ready(data_dir: Path, job_id: str) -> bool:
    """Whether the job's supervisor holds a loaded standby (local backend, live jobs): its
    loading costs the pods CPU, so a measurement waits for it to be over."""
    try:
        state = job_state(data_dir, job_id)
    except (OSError, ValueError):
        return False
    return bool((state.get("standby") or {}).get("ready"))


def healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def serve(data_dir: Path | None = None) -> Iterator[tuple[httpx.Client, Path]]:
    """The control plane, and a client that holds its admin token; stopped on the way out (its
    jobs' pods are the caller's to cancel: they outlive it)."""
    with tempfile.TemporaryDirectory() as scratch:
        data_dir, port = data_dir or Path(scratch), free_port()
        env = {**os.environ, "MIGRATOR_DATA_DIR": str(data_dir), "MIGRATOR_ADMIN_TOKEN": TOKEN,
               "MIGRATOR_RECONCILE_INTERVAL": "0.5", "MIGRATOR_RESTART_BUDGET": "100"}
        server = subprocess.Popen([sys.executable, "-m", "api", "--port", str(port)], env=env,
                                  stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                              headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                wait(lambda: healthy(http), 60, "the API")
                yield http, data_dir
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
