"""A real PostgreSQL server for the tests (Debian's `postgresql` 15): a throwaway cluster in a
temporary directory on a free 127.0.0.1 port, a fresh database per test, stopped by pid.

`initdb` and `pg_ctl` refuse to run as root: as root they run as the `postgres` user (what
`initdb` requires), and the cluster's directory belongs to it."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psutil
import psycopg

from tests.support import ThrowawayServer, accepts, free_port, wait_for

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
"""Debian puts each major version's server programs here, off the PATH."""


def server_bin() -> Path | None:
    """The newest installed server's bin directory, if any."""
    for directory in BIN_DIRS:
        if (directory / "initdb").is_file():
            return directory
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class PostgresServer(ThrowawayServer):
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="migrator-pg-"))
        self.data = self.root / "cluster"
        self.pid: int | None = None
        self._names = itertools.count()
        self._as_postgres = os.geteuid() == 0

    def _run(self, *argv: str) -> None:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def _start(self) -> None:
        """Initialise and start the cluster."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                  "-t", "60", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c max_connections=200", "start")
        self.pid = self._postmaster_pid()
        wait_for(lambda: accepts(self.port), what="PostgreSQL to listen", timeout=30)

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its SQLAlchemy URL."""
        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                             dbname="postgres", autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """SIGQUIT to the postmaster (immediate shutdown: nothing here needs keeping), then
        SIGKILL if it lingers; the cluster's directory goes with it."""
        pid = self.pid or self._postmaster_pid()  # a start that failed half-way
        if pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                postmaster = psutil.Process(pid)
                postmaster.send_signal(signal.SIGQUIT)
                try:
                    postmaster.wait(timeout=20)
                except psutil.TimeoutExpired:
                    postmaster.kill()
        shutil.rmtree(self.root, ignore_errors=True)
