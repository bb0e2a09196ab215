"""A real object store for the tests on a free 127.0.0.1 port, stopped by pid: Azurite's blob
service (Azure's emulator; npm's azurite, pinned in tests/stores/package-lock.json and installed
by `make setup`). The tests see it through `Store`: the environment variables the client
libraries (azure-storage-blob, adlfs) read, and a fresh container per `new_location`.

(moto's S3 server cannot be installed beside the kubernetes client, nor can s3fs: their
botocore wants python-dateutil<3, kubernetes>=36 wants >=3. `Store` stays store-neutral.)

The server keeps nothing worth a clean shutdown (Azurite ignores SIGTERM anyway): it is stopped
with SIGKILL, its whole process tree, and its workspace goes with it."""

from __future__ import annotations

import contextlib
import itertools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support import ThrowawayServer, free_port, wait_for

AZURITE_BIN = Path(__file__).resolve().parent / "stores/node_modules/.bin/azurite-blob"
"""Where `npm ci` in tests/stores (`make setup`) puts Azurite's blob service."""

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
"""Azurite's well-known development account (public, documented by Microsoft)."""

def azurite_bin() -> Path | None:
    """Azurite's blob service, if installed (and Node.js, which runs it, is on the PATH)."""
    if AZURITE_BIN.is_file() and shutil.which("node"):
        return AZURITE_BIN
    return None


@dataclass
class Store:
    """An object store as the tests use it, whichever server is behind it.

    `kind` is `azure`; `url_prefix` is what every location's URL starts with (`az://`,
    fsspec's protocol); `env` holds the standard variables
    the client libraries read (set them with monkeypatch.setenv); `new_location` creates an
    empty container or bucket and returns its URL; `create` makes one of a given name."""

    kind: str
    url_prefix: str
    env: dict[str, str]
    create: Callable[[str], None] = field(repr=False)
    _numbers: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    def new_location(self, name: str = "t") -> str:
        """A new, empty container or bucket, named after `name` (lowercase letters, digits and
        single hyphens, a number to make it unique; 3 to 63 characters, valid for both Azure
        and S3); its URL, such as `az://checkpoints-3` or `s3://checkpoints-3`."""
        suffix = f"-{next(self._numbers)}"
        slug = "-".join(re.findall(r"[a-z0-9]+", name.lower()))[:63 - len(suffix)].strip("-")
        bucket = f"{slug or 't'}{suffix}"
        self.create(bucket)
        return f"{self.url_prefix}{bucket}"


def _kill_tree(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL to `process` and to every process under it; waits for them all to go."""
    if process is None:
        return
    children: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        children = psutil.Process(process.pid).children(recursive=True)
    process.kill()  # a no-op once it has exited (a failed start)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    process.wait(timeout=20)  # reaped here, where its exit status belongs
    psutil.wait_procs(children, timeout=20)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a server in its own session, its output to `log` (for a failed start's message)."""
    with log.open("wb") as handle:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _listens(process: subprocess.Popen[bytes], port: int) -> bool:
    """Whether `process` (not whatever else might have taken the port) listens on `port`."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(process.pid)
        return any(connection.status == psutil.CONN_LISTEN and connection.laddr.port == port
                   for member in [root, *root.children(recursive=True)]
                   for connection in member.net_connections(kind="tcp"))
    return False


def _wait_until_listening(process: subprocess.Popen[bytes], port: int, what: str, log: Path,
                          ) -> None:
    try:
        wait_for(lambda: _listens(process, port), what=f"{what} to listen", timeout=60,
                 process=process)
    except AssertionError as error:
        raise AssertionError(f"{error}; its output:\n{_log_tail(log)}") from None


def _log_tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-2000:]
    return ""


class AzuriteServer(ThrowawayServer):
    """Azurite's blob service, its workspace in a temporary directory."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="migrator-azurite-"))
        self.log = self.root / "azurite.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};"
                f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT};")

    def _start(self) -> None:
        """Start it and wait until it listens."""
        workspace = self.root / "workspace"
        workspace.mkdir()
        self.process = _spawn([str(self.binary), "--blobHost", "127.0.0.1",
                               "--blobPort", str(self.port), "--location", str(workspace),
                               "--skipApiVersionCheck", "--loose", "--silent",
                               "--disableTelemetry"], self.log)
        _wait_until_listening(self.process, self.port, "Azurite", self.log)

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as client:
            client.create_container(name)

    def store(self) -> Store:
        return Store("azure", "az://", {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string},
                     self.create_container)

    def stop(self) -> None:
        _kill_tree(self.process)
        shutil.rmtree(self.root, ignore_errors=True)
