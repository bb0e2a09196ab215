"""The heartbeat file a Kubernetes readiness probe reads (trainer.report.HeartbeatFile)."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.config import load_config
from trainer.contract.records import Started
from trainer.main import build_reporter
from trainer.report import HeartbeatFile


def test_records_touch_the_file_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "run" / "heartbeat"
    sink = HeartbeatFile(path, interval=3600)
    assert not path.exists()
    sink.write({"seq": 1, "kind": "metric", "time": 0.0, "data": {}})
    assert path.is_file()
    os.utime(path, (1_000_000, 1_000_000))
    sink.write({"seq": 2, "kind": "metric", "time": 0.0, "data": {}})
    assert path.stat().st_mtime == 1_000_000  # within the interval: not touched again
    sink.interval = 0.0
    sink.write({"seq": 3, "kind": "metric", "time": 0.0, "data": {}})
    assert path.stat().st_mtime > 1_000_000
    assert sink.flush() is True


def test_heartbeat_file_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "heartbeat"
    config = load_config([], {"HEARTBEAT_FILE": str(path), "JOB_ID": "job-1"})
    assert config.runtime.heartbeat_file == path
    reporter = build_reporter(config, "job-1-0", {})
    reporter.emit(Started(message="training started", step=0, epoch=1, samples={}))
    assert path.is_file()
    reporter.close()
    assert not any(isinstance(s, HeartbeatFile)
                   for s in build_reporter(load_config([], {}), "p", {}).sinks)
