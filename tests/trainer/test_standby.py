"""`python -m trainer.standby`: a real process loads a job's model and data, waits, and trains
as the pod its assignment names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import make_reviews_csv, tiny_spec
from tests.support import wait_for
from trainer.contract.process import ExitCode
from trainer.contract.runtime import SPEC_ENV, Runtime

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def job_env(inputs: Path, work: Path) -> dict[str, str]:
    """A pod's environment without the pod: what a supervisor gives its standby."""
    spec = tiny_spec(epochs=1, checkpoint_every_steps=0)
    runtime = Runtime(job_id="job-standby", inputs_dir=inputs, cache_dir=work / "cache",
                      checkpoint_dir=work / "checkpoints", model_dir=work / "model")
    return {**os.environ, SPEC_ENV: json.dumps(spec), **runtime.to_env()}


def start(env: dict[str, str], work: Path) -> subprocess.Popen[bytes]:
    with (work / "standby.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "trainer.standby", "--ready-file", str(work / "loaded")],
            env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)


@pytest.fixture
def standby(inputs_dir: Path, tmp_path: Path):
    make_reviews_csv(inputs_dir / "reviews.csv", rows=200)
    env = job_env(inputs_dir, tmp_path)
    process = start(env, tmp_path)
    yield process, env
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def test_it_loads_then_trains_as_the_pod_it_is_handed(standby, tmp_path: Path) -> None:
    process, env = standby
    wait_for(lambda: (tmp_path / "loaded").exists(), process=process, timeout=120,
             what="the standby to load")
    pod_log, metrics = tmp_path / "pod.log", tmp_path / "reports.jsonl"
    environ = {**env, **Runtime(
        job_id="job-standby", pod_name="job-standby-0", incarnation="7",
        inputs_dir=Path(env["INPUTS_DIR"]), cache_dir=Path(env["TRAINER_CACHE_DIR"]),
        checkpoint_dir=Path(env["CHECKPOINT_DIR"]), model_dir=Path(env["MODEL_DIR"]),
        metrics_file=metrics, max_steps=3).to_env()}
    assert process.stdin is not None
    process.stdin.write(json.dumps({"environ": environ, "log": str(pod_log)}).encode() + b"\n")
    process.stdin.close()
    assert process.wait(timeout=120) == ExitCode.OK, pod_log.read_text()[-3000:]

    text = pod_log.read_text()
    assert f"standby pid {process.pid} becomes pod job-standby-0" in text
    assert "pod=job-standby-0" in text  # the pod's own log lines from then on
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r["data"]["step"] for r in records if r["kind"] == "metric"]
    assert steps == [1, 2, 3]
    assert {r["pod"] for r in records} == {"job-standby-0"}
    assert {r["incarnation"] for r in records} == {"7"}
    assert "job-standby-0" not in (tmp_path / "standby.log").read_text()


def test_it_ends_quietly_when_its_supervisor_is_gone(standby, tmp_path: Path) -> None:
    process, _ = standby
    wait_for(lambda: (tmp_path / "loaded").exists(), process=process, timeout=120,
             what="the standby to load")
    assert process.stdin is not None
    process.stdin.close()  # what the supervisor's death does to the pipe
    assert process.wait(timeout=30) == ExitCode.OK
    assert "no pod to become" in (tmp_path / "standby.log").read_text()
    assert not (tmp_path / "reports.jsonl").exists()


def test_an_unreadable_assignment_fails_it(standby, tmp_path: Path) -> None:
    process, _ = standby
    assert process.stdin is not None
    process.stdin.write(b'{"environ": "not a mapping"}\n')
    process.stdin.close()
    assert process.wait(timeout=120) == ExitCode.FAILED
    assert "unreadable assignment" in (tmp_path / "standby.log").read_text()
