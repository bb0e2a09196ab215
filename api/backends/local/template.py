"""The control plane's fork-server template (trainer.forktemplate): each job's supervisor asks it
for the job's fork server, which is then ready at once instead of after seconds of imports
(torch, transformers, the trainer). A supervisor finds it by `programs.TEMPLATE_ENV`; where it
is gone or refuses, the supervisor spawns the job's server as before.

Its environment is what every job's pods share and nothing secret: the control plane's without
its settings, the hub token or the artifact store's credentials, the hub offline as the pods
have it. A process forked from it holds no secret but those of its own job.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

from trainer.contract.process import PRIVATE_UMASK
from trainer.contract.staged import HUB_TOKEN_VARIABLES, OFFLINE_ENV
from trainer.forkserver import IMPORT_TIME_PREFIXES

SHARED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_", "TZ", "TMPDIR")
"""Beyond what libraries read as they load, what a process's environment needs."""


def template_env(base: dict[str, str]) -> dict[str, str]:
    """The template's environment: of `base` (a supervisor's), what libraries read as they
    load (as its pods have it) and the basics, the hub offline."""
    return {**{k: v for k, v in base.items()
               if k.startswith((*IMPORT_TIME_PREFIXES, *SHARED)) and k not in HUB_TOKEN_VARIABLES},
            **OFFLINE_ENV}


class Template:
    """The template process, listening on a socket in a private directory of its own; it ends
    with this process (its stdin is a pipe held here)."""

    def __init__(self, base: dict[str, str], log: Path) -> None:
        # Private (mkdtemp's mode 0700) and short: a socket's path holds 107 bytes at most.
        self.directory = Path(tempfile.mkdtemp(prefix="migrator-forks-"))
        self.socket = self.directory / "template.sock"
        with log.open("ab") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trainer.forktemplate", "--listen", str(self.socket)],
                env=template_env(base), stdin=subprocess.PIPE, stdout=handle,
                stderr=subprocess.STDOUT, start_new_session=True, umask=PRIVATE_UMASK)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.socket.unlink(missing_ok=True)
            self.directory.rmdir()
