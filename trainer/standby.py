"""A warm standby: a trainer process that has done everything a pod does before it needs to
know which pod it is (imports, tokenizer, tokenized data, the model), and waits to become one.

A live job's local supervisor keeps one ready beside its pods
(api/backends/local/standby_process.py). A pod that (re)starts after a failure or a graceful leave,
a new ordinal of a scale-up or a migration's replacement becomes the standby instead of a fresh
process, so it takes part after a heal rather than after seconds of Python start-up and model
loading. A restart-mode pod's agent keeps one for its next round's worker
(trainer.fault_tolerance.warm_worker).

    python -m trainer.standby --ready-file PATH [--die-with-parent]

Its environment is a pod's without the pod's identity. It creates the ready file once loaded and
then reads one JSON line on stdin, `{"environ": {...}, "log": "path"}`: the whole environment of
the pod it becomes and the log its output goes to from then on (null: where it goes already).
End of input (its supervisor is gone) ends it with code 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, load_config
from trainer.contract.process import ExitCode
from trainer.contract.runtime import Runtime
from trainer.main import configure_logging, main
from trainer.model import ModelError, choose_device
from trainer.report import trust

logger = logging.getLogger("trainer.standby")
NAME = "standby"


def read_assignment(line: str) -> tuple[dict[str, str], Path | None]:
    """The pod's environment and log (None: this process's output already goes there) from
    its starter's line; ValueError if malformed."""
    data: Any = json.loads(line)
    environ, log = data.get("environ"), data.get("log")
    if not isinstance(environ, dict) or not isinstance(log, str | None) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
        raise ValueError("expected {\"environ\": {name: value}, \"log\": path or null}")
    return environ, None if log is None else Path(log)


def redirect_output(log: Path) -> None:
    """Send this process's stdout and stderr (Python's and native code's) to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def become(environ: dict[str, str]) -> None:
    """Take the pod's environment, the variables native code reads (torchft's) included."""
    os.environ.clear()
    os.environ.update(environ)
    import torch

    threads = environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # read at import: the pod's may differ (scaled)


def run(ready_file: Path, die_with_parent: bool = False) -> int:
    started = time.monotonic()
    if die_with_parent:
        from trainer.distributed import die_with_parent as with_parent

        with_parent()
    try:
        config = load_config([], os.environ)
    except ConfigError as exc:
        print(f"trainer: invalid configuration: {exc}", file=sys.stderr)  # noqa: T201
        return ExitCode.BAD_INPUT
    configure_logging(config.runtime.job_id, NAME)
    from trainer.data import DataError
    from trainer.fault_tolerance import live  # noqa: F401  (imported now, not when the pod starts)
    from trainer.prepare import prepare, warm_up
    from trainer.train import Trainer  # noqa: F401  (the same: 30 ms here)

    device = choose_device()
    try:
        prepared = prepare(config, device.device)
    except (DataError, ModelError) as exc:
        logger.error("%s", exc)
        return ExitCode.BAD_INPUT
    warm_up(prepared, config.spec, device)
    trust()  # what the pod's report client will need
    ready_file.touch()
    logger.info("ready in %.1f s: waiting to become a pod", time.monotonic() - started)
    line = sys.stdin.readline()
    if not line:
        logger.info("no pod to become: whoever started it is gone")
        return ExitCode.OK
    try:
        environ, log = read_assignment(line)
    except ValueError as exc:
        logger.error("unreadable assignment: %s", exc)
        return ExitCode.FAILED
    if log is not None:
        redirect_output(log)
    become(environ)
    logger.info("standby pid %d becomes pod %s (started %.1f s ago)", os.getpid(),
                environ.get(Runtime.env_name("pod_name"), "?"), time.monotonic() - started)
    return main([], os.environ, prepared)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.standby",
                                     description="Load a job's model and data, then wait to "
                                                 "become one of its pods.")
    parser.add_argument("--ready-file", type=Path, required=True,
                        help="created once everything is loaded")
    parser.add_argument("--die-with-parent", action="store_true",
                        help="end with the process that started it (a restart-mode pod's agent)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    from trainer.allocator import keep_freed_memory

    keep_freed_memory(os.environ)  # process-wide, as in trainer/__main__.py
    args = parse_args(None)
    code = run(args.ready_file, args.die_with_parent)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as trainer/__main__.py, and for the same reason
