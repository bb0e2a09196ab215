"""The control plane's files are its user's alone: directories 0700, files 0600.

`python -m api` runs with PRIVATE_UMASK, and the local backend starts every supervisor (so every
pod, lighthouse and store) with it: what they create is private as it is created. The data dir
is made private as well at start-up, which also covers what an earlier version created there
with the default umask, and a process that embeds the app with a wider umask.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

logger = logging.getLogger(__name__)


def private_dir(path: Path) -> Path:
    """`path` as a directory that only its owner can enter: created so, or tightened."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    tighten(path)
    return path


def tighten(path: Path) -> None:
    """Take group and other permissions away from `path` where this user owns it (a mount
    point that another user owns, such as a volume's root on Kubernetes, stays as it is)."""
    try:
        status = path.stat()
        if status.st_uid == os.geteuid() and status.st_mode & 0o077:
            path.chmod(stat.S_IMODE(status.st_mode) & 0o700)
    except OSError as exc:  # a permission the API cannot change must not stop it
        logger.warning("cannot make %s private: %s", path, exc)
