"""`python -m api.cli.demo` (api/cli/demo.py): bad input stops it early; Ctrl-C cancels its job."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from sqlmodel import Session, create_engine

from api.backends.local.backend import LocalBackend
from api.cli import demo
from api.models import Job
from api.settings import Settings
from tests.api.conftest import ADMIN_TOKEN, AUTH
from tests.conftest import Processes
from tests.factories import tiny_spec
from tests.support import free_port, wait_for

# Long enough to be interrupted while it trains, whatever the machine's speed.
SPEC = tiny_spec(name="interrupted demo", replicas=2, epochs=100, batch_size=2,
                 checkpoint_every_steps=0)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_bad_input_exits_2_before_anything_starts(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--spec", "{nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the spec is not valid JSON") and err.count("\n") == 1
    monkeypatch.setenv("MIGRATOR_BACKEND", "bogus")
    assert demo.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid settings: MIGRATOR_BACKEND") and err.count("\n") == 1


@pytest.mark.slow
def test_ctrl_c_cancels_the_demos_job_and_stops_its_control_plane(
        tmp_path: Path, inputs_dir: Path, processes: Processes) -> None:
    data_dir, port, log = tmp_path / "data", free_port(), tmp_path / "demo.log"
    env = {"MIGRATOR_DATA_DIR": str(data_dir), "MIGRATOR_ADMIN_TOKEN": ADMIN_TOKEN,
           "MIGRATOR_INPUTS_DIR": str(inputs_dir), "MIGRATOR_RECONCILE_INTERVAL": "0.3"}
    # Output to a file, not a terminal: the plain progress lines.
    process = processes.start([sys.executable, "-m", "api.cli.demo", "--port", str(port),
                               "--spec", json.dumps(SPEC)], env, log)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=30)
    server_pid: int | None = None
    job_id: str | None = None

    def running_job() -> str | None:
        assert process.poll() is None, log.read_text()
        with contextlib.suppress(httpx.HTTPError):
            jobs = http.get("/api/v1/jobs").json()["data"]
            if jobs and jobs[0]["status"] == "running":
                return str(jobs[0]["id"])
        return None

    try:
        server_pid = wait_for(lambda: [c.pid for c in psutil.Process(process.pid).children()],
                              timeout=30, what="the control plane to start")[0]
        job_id = wait_for(running_job, timeout=180, what="the demo's job to train")
        state = json.loads((data_dir / "jobs" / job_id / "state.json").read_text())
        pids = [state["supervisor_pid"], state["coordinator"]["pid"],
                *(pod["pid"] for pod in state["pods"])]
        assert all(pids) and all(alive(pid) for pid in pids)

        os.kill(process.pid, signal.SIGINT)  # what Ctrl-C sends it (its server has a session)
        assert process.wait(timeout=120) == 130, log.read_text()[-4000:]
        output = log.read_text()
        assert f"Submitted {job_id}: interrupted demo, 2 pods" in output
        assert f"Cancelled {job_id}: " in output and "Stopping the control plane." in output
        assert "Traceback" not in output
        wait_for(lambda: not alive(server_pid), timeout=30, what="the control plane to exit")
        wait_for(lambda: not any(alive(pid) for pid in pids),
                 timeout=30, what="the job's processes to exit")
        engine = create_engine(Settings(data_dir=data_dir).sqlite_url)
        with Session(engine) as session:
            job = session.get(Job, job_id)
            assert job is not None and job.status == "cancelled"
        engine.dispose()
    finally:
        http.close()
        if server_pid is not None and alive(server_pid):  # the demo failed to stop it
            os.killpg(server_pid, signal.SIGKILL)
        if job_id is not None:
            LocalBackend(data_dir / "jobs").delete(job_id)
