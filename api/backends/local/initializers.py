"""The local backend's initializers: one process per staging (trainer.initializer), started by
the control plane and watched by it alone; no supervisor takes part."""

from __future__ import annotations

import subprocess
import sys
import threading

from api.backends.base import BackendError, StagingRequest
from api.backends.local.watchdog import child_env
from trainer.contract.process import PRIVATE_UMASK
from trainer.contract.staged import ONLINE_ENV, progress_file


class Initializers:
    def __init__(self) -> None:
        self._running: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()  # routes and the reconciler call in from several threads

    def start(self, request: StagingRequest) -> None:
        """Start the staging's initializer unless one runs. It inherits the control plane's
        environment (HF_ENDPOINT, HF_TOKEN), and is the one process whose hub client is
        online."""
        with self._lock:
            if self._alive(request.staging_id):
                return
            env = child_env(**ONLINE_ENV)
            argv = [sys.executable, "-m", "trainer.initializer", request.kind, request.repo_id,
                    "--revision", request.revision, "--inputs", str(request.inputs_dir),
                    "--progress", str(progress_file(request.inputs_dir, request.staging_id)),
                    *(["--spec", request.spec] if request.spec else [])]
            request.log_file.parent.mkdir(parents=True, exist_ok=True)
            try:
                with request.log_file.open("ab") as log:
                    self._running[request.staging_id] = subprocess.Popen(
                        argv, cwd=request.log_file.parent, env=env, stdin=subprocess.DEVNULL,
                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                        umask=PRIVATE_UMASK)
            except OSError as exc:
                raise BackendError(f"cannot start the initializer of {request.repo_id}: "
                                   f"{exc}") from None

    def running(self, staging_id: str) -> bool:
        with self._lock:
            return self._alive(staging_id)

    def _alive(self, staging_id: str) -> bool:
        """Whether it runs; an ended one is reaped and forgotten (the caller holds the lock)."""
        child = self._running.get(staging_id)
        if child is not None and child.poll() is None:
            return True
        self._running.pop(staging_id, None)
        return False
