"""What a trainer process tells its backend without HTTP (its exit code and its log lines), and
how every process of the product creates files."""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    """Training failed; the backend recreates the pod (within the job's restart budget)."""
    BAD_INPUT = 2
    """The job cannot run as specified (unknown dataset, bad config, a loss that is not finite
    where the spec says to fail): no restart helps."""
    PEER_STOPPED = 3
    """Stopped because another participant got SIGTERM: not done, so never 0 (torchrun would
    take a 0 for the end of training)."""


PRIVATE_UMASK = 0o077
"""The umask of the control plane and of every process of a job: files 0600, directories 0700.
A job's directory holds its report token and heal secret, its logs and checkpoints hold its data
and model. On Kubernetes the API and the trainer pods run as one user (`manifests.USER_ID`, the
API Deployment's `runAsUser`), so each still reads what the other wrote on the shared volumes."""


LOG_FORMAT = "%(asctime)s %(levelname)s job={job_id} pod={pod} %(name)s: %(message)s"
"""The trainer's log lines (`str.format` job_id and pod first, then `logging` fills the rest)."""

LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d [\d:,.]+ (?P<level>[A-Z]+) job=\S+ pod=\S+ \S+: ")
"""Matches what LOG_FORMAT puts before the message."""


def log_format(job_id: str, pod: str) -> str:
    return LOG_FORMAT.format(job_id=job_id, pod=pod)


def failure_reason(lines: Iterable[str]) -> str | None:
    """Why a pod failed, from its last log lines: the trainer's last error message (its
    launcher may log after it), else the last line; without the log prefix."""
    stripped = [line.strip() for line in lines if line.strip()]
    errors = [match for line in stripped if (match := LOG_PREFIX.match(line))
              and match.group("level") == "ERROR"]
    if errors:
        return errors[-1].string[errors[-1].end():]
    return LOG_PREFIX.sub("", stripped[-1]) if stripped else None
