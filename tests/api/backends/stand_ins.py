"""A supervisor run in the test's process, with stand-ins for what it starts.

Each pod is a real process group: a Python sleeper that exits 0 on SIGTERM (as a trainer that
leaves does), writes a replica id where a live trainer writes the one the lighthouse knows it
by, and says it is up with a file beside its ready file. A test creates a pod's ready
file where a trainer would once it took part. The standby stand-in speaks trainer.standby's
protocol: it creates its ready file, reads its assignment on stdin, writes to the pod's log
from then on and becomes a sleeper pod.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from api.backends import programs
from api.backends.base import Launch
from api.backends.local.jobdir import JobDir, LaunchDocument
from api.backends.local.standby_process import SETTLE_SECONDS
from api.backends.local.supervisor import Supervisor
from tests.support import PEER_SECRET, wait_for
from trainer.contract.spec import JobSpec

POD = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
up = pathlib.Path(os.environ['READY_FILE'] + '.up')
up.parent.mkdir(exist_ok=True)
if os.environ.get('REPLICA_FILE'):
    from trainer.contract.credentials import member_id
    replica = (member_id(os.environ['PEER_SECRET'], os.environ['POD_NAME'])
               + ':incarnation-' + os.environ['POD_INCARNATION'])
    pathlib.Path(os.environ['REPLICA_FILE']).write_text(replica)
up.touch()
time.sleep(120)
"""
SLEEPER = [sys.executable, "-c", POD]
STANDBY = """
import json, os, pathlib, sys
pathlib.Path(sys.argv[1]).touch()
line = sys.stdin.readline()
if not line:
    sys.exit(0)
assignment = json.loads(line)
fd = os.open(assignment['log'], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.dup2(fd, 1)
os.dup2(fd, 2)
os.environ.clear()
os.environ.update(assignment['environ'])
print('standby', os.getpid(), 'became', os.environ['POD_NAME'], 'incarnation',
      os.environ['POD_INCARNATION'], flush=True)
"""


def standby_argv(ready_file: Path, python: str = "python") -> list[str]:
    return [sys.executable, "-c", STANDBY + POD, str(ready_file)]


def start_supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, standby: bool,
                     lighthouse: bool = False,
                     settle_seconds: float = SETTLE_SECONDS,
                     spec: JobSpec | None = None) -> Supervisor:
    """A live job of 2 replicas (max 4; `spec`'s where given) with its lighthouse (a stand-in
    unless `lighthouse`) and pods started."""
    monkeypatch.setattr(programs, "pod_argv", lambda *args, **kwargs: SLEEPER)
    if not lighthouse:
        monkeypatch.setattr(programs, "lighthouse_argv", lambda *args, **kwargs: SLEEPER)
    monkeypatch.setattr(programs, "standby_argv", standby_argv)
    job_dir = JobDir(tmp_path / "job-elastic")
    for sub in (job_dir.logs, job_dir.commands):
        sub.mkdir(parents=True)
    spec = spec or JobSpec(replicas=2, max_replicas=4)
    launch = Launch(job_id=job_dir.job_id, pods=spec.pods,
                    fault_tolerance="live", spec=spec, report_url="http://127.0.0.1:9",
                    report_token="t", checkpoint_dir=tmp_path / "checkpoints",
                    model_dir=tmp_path / "model", inputs_dir=tmp_path,
                    cache_dir=tmp_path / "cache", peer_secret=PEER_SECRET)
    running = Supervisor(job_dir, LaunchDocument(launch, standby=standby),
                         settle_seconds=settle_seconds)
    running.ensure_coordinator()
    for pod in running.pods:
        running.start_pod(pod, first=True)
    return running


def up(supervisor: Supervisor) -> bool:
    """Every process of every pod has its SIGTERM handler installed."""
    return all(Path(f"{supervisor.job_dir.ready(pod.name, incarnation)}.up").exists()
               for pod in supervisor.pods
               for incarnation in [pod.incarnation, *([pod.surge.incarnation]
                                                      if pod.surge else [])])


def took_part(supervisor: Supervisor) -> None:
    """Create each current incarnation's ready file, as its trainer would."""
    for pod in supervisor.pods:
        ready = supervisor.job_dir.ready(pod.name, pod.incarnation)
        ready.parent.mkdir(exist_ok=True)
        ready.touch()


def ticks_until(supervisor: Supervisor, condition: Any, what: str) -> Any:
    def ticked() -> Any:
        supervisor.tick()
        return condition()
    return wait_for(ticked, timeout=20, what=what)
