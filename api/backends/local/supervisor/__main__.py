"""The supervisor's command line: `python -m api.backends.local.supervisor <job_dir> [--adopt]`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from api.backends.local.jobdir import JobDir, UnreadableDocument, read_launch, read_state, try_lock
from api.backends.local.supervisor.loop import Supervisor

logger = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = 1.0


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
