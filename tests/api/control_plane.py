"""The real control plane in a process of its own (`python -m api`, local backend), for tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from api.backends.local.backend import LocalBackend
from tests.api.conftest import ADMIN_TOKEN, AUTH
from tests.conftest import Processes
from tests.support import free_port, wait_for


class ControlPlane:
    def __init__(self, processes: Processes, data_dir: Path, inputs_dir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.processes, self.data_dir, self.inputs_dir = processes, data_dir, inputs_dir
        self.env = env or {}
        """More environment for the API process, inherited by supervisors and pods."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, headers=AUTH, timeout=30)
        self.process = None
        self._events: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def start(self) -> None:
        """Start the API; on its first start, on another free port should another process
        have taken this one since it was picked (a restart keeps the port: pods know it)."""
        first = self.process is None
        for _ in range(3 if first else 1):
            log = self._start()
            if self._wait_started():
                return
            if "address already in use" not in log.read_text():
                break
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.http.close()
            self.http = httpx.Client(base_url=self.url, headers=AUTH, timeout=30)
        wait_for(self._healthy, timeout=60, what="the API to start")

    def _wait_started(self) -> bool:
        """Whether the API answers (False: it exited)."""
        with contextlib.suppress(AssertionError):
            wait_for(self._healthy, timeout=60, what="the API to start")
            return True
        return False

    def _start(self) -> Path:
        # The session's fork-server template stands in for the one each `python -m api` starts.
        template = ({"MIGRATOR_FORK_TEMPLATE": str(self.processes.forks.template())}
                    if self.processes.forks is not None else {})
        env = {"MIGRATOR_DATA_DIR": str(self.data_dir), "MIGRATOR_ADMIN_TOKEN": ADMIN_TOKEN,
               "MIGRATOR_INPUTS_DIR": str(self.inputs_dir), "MIGRATOR_RECONCILE_INTERVAL": "0.3",
               **template, **self.env}
        log = self.data_dir.parent / f"api-{time.monotonic_ns()}.log"
        self.process = self.processes.start(
            [sys.executable, "-m", "api", "--port", str(self.port)], env, log)
        return log

    def _healthy(self) -> bool:
        assert self.process is not None and self.process.poll() is None, "the API exited"
        with contextlib.suppress(httpx.HTTPError):
            return self.http.get("/healthz").status_code == 200
        return False

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def restart(self) -> None:
        """SIGKILL the API (its jobs live on under their supervisors) and start it again."""
        self.kill()
        self.start()

    def report_token(self, job_id: str) -> str:
        """The job's report token, from the local backend's launch record."""
        launch = json.loads((self.data_dir / "jobs" / job_id / "launch.json").read_text())
        return str(launch["report_token"])

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, job_id: str, kind: str) -> list[dict[str, Any]]:
        """The job's events of this type so far. Each call reads only those after the last one
        it saw: tests poll this, and reading a job's whole history each time would cost the
        pods' two cores as much as their steps (SQLite commits event ids in order)."""
        found = self._events.setdefault((job_id, kind), [])
        while True:
            after = found[-1]["id"] if found else 0
            page = self.http.get(f"/api/v1/jobs/{job_id}/events",
                                 params={"after": after, "type": kind, "limit": 1000}).json()
            found += page["data"]
            if page["next_after"] is None:
                return list(found)

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 240) -> dict[str, Any]:
        return wait_for(lambda: (job := self.job(job_id))["status"] in statuses and job,
                        timeout=timeout, what=f"job {job_id} to become {statuses}", interval=0.1)

    def state(self, job_id: str) -> dict[str, Any]:
        """The job's supervisor state (pods' and coordinator's pids, restarts)."""
        state: dict[str, Any] = json.loads(
            (self.data_dir / "jobs" / job_id / "state.json").read_text())
        return state

    def pod_pids(self, job_id: str) -> list[int]:
        return [p["pid"] for p in self.state(job_id)["pods"] if p.get("pid")]

    def close(self) -> None:
        """Delete every job's workload (no pod outlives the test) and close the client. The
        jobs are deleted side by side: each delete waits for its supervisor to stop its pods."""
        self.http.close()
        backend = LocalBackend(self.data_dir / "jobs")
        jobs = [job_dir.name for job_dir in (self.data_dir / "jobs").glob("job-*")]
        with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
            list(pool.map(backend.delete, jobs))  # an error is raised here, as before
