"""Real object stores for the tests, each on a free 127.0.0.1 port and stopped by pid:

- Azure Blob: Azurite's blob service (Azure's emulator; npm's azurite, pinned in
  tests/stores/package-lock.json);
- S3: moto's server (`moto[server]`, pinned in tests/stores/requirements.txt), in a virtual
  environment of its own, tests/stores/.venv: its botocore wants python-dateutil<3, which the
  project's kubernetes client does not allow beside it.

`make test-setup` installs both. The tests see a server through `Store`: the standard variables
its client libraries read (adlfs; obstore), and a fresh container or bucket per `new_location`.

The servers keep nothing worth a clean shutdown (Azurite ignores SIGTERM anyway): they are
stopped with SIGKILL, their whole process tree, and their workspace goes with them."""

from __future__ import annotations

import contextlib
import itertools
import re
import secrets
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support import ThrowawayServer, free_port, wait_for

STORES = Path(__file__).resolve().parent / "stores"
AZURITE_BIN = STORES / "node_modules/.bin/azurite-blob"
"""Where `npm ci` in tests/stores (`make test-setup`) puts Azurite's blob service."""
MOTO_BIN = STORES / ".venv/bin/moto_server"
"""Where `make test-setup` puts moto's server."""

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
"""Azurite's well-known development account (public, documented by Microsoft)."""

@dataclass
class Store:
    """An object store as the tests use it, whichever server is behind it.

    `kind` is `azure` or `s3`; `url_prefix` is what every location's URL starts with (`az://`,
    `s3://`: fsspec's protocol); `env` holds the standard variables the client libraries read
    (set them with monkeypatch.setenv); `secret` is the part of them that must never show (in
    an event, a log, a job); `new_location` creates an empty container or bucket and returns
    its URL; `create` makes one of a given name."""

    kind: str
    url_prefix: str
    env: dict[str, str]
    secret: str
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


class StoreServer(ThrowawayServer):
    """A store's server process from an installed `binary`, its files in a temporary directory
    that goes with it. Subclasses name their `kind` (`Store.kind`), say how to install them
    (`missing`), find their binary (`installed`), start it (`_start`) and describe it as a
    `Store` (`store`)."""

    kind: str
    missing: str

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"migrator-{self.kind}-"))
        self.log = self.root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def installed(cls) -> Path | None:
        raise NotImplementedError

    def store(self) -> Store:
        raise NotImplementedError

    def stop(self) -> None:
        _kill_tree(self.process)
        shutil.rmtree(self.root, ignore_errors=True)


class AzuriteServer(StoreServer):
    """Azurite's blob service."""

    kind = "azure"
    missing = "Azurite is not installed (make test-setup: npm ci in tests/stores; Node.js)"

    @classmethod
    def installed(cls) -> Path | None:
        """Its binary, if installed (and Node.js, which runs it, is on the PATH)."""
        return AZURITE_BIN if AZURITE_BIN.is_file() and shutil.which("node") else None

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
        return Store(self.kind, "az://",
                     {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}, AZURITE_KEY,
                     self.create_container)


class MotoServer(StoreServer):
    """moto's S3 server. It checks no signatures; the secret key is made up per server, so that a
    test can look for it where it must not be."""

    kind = "s3"
    missing = "moto's S3 server is not installed (make test-setup: tests/stores/.venv)"

    def __init__(self, binary: Path) -> None:
        super().__init__(binary)
        self.secret = f"moto-secret-{secrets.token_hex(12)}"

    @classmethod
    def installed(cls) -> Path | None:
        return MOTO_BIN if MOTO_BIN.is_file() else None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        self.process = _spawn([str(self.binary), "-H", "127.0.0.1", "-p", str(self.port)],
                              self.log)
        _wait_until_listening(self.process, self.port, "moto's S3 server", self.log)

    def create_bucket(self, name: str) -> None:
        """A PUT on the bucket (S3's CreateBucket; moto takes it unsigned)."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200, response.status

    def store(self) -> Store:
        env = {"AWS_ACCESS_KEY_ID": "migrator-tests", "AWS_SECRET_ACCESS_KEY": self.secret,
               "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1"}
        return Store(self.kind, "s3://", env, self.secret, self.create_bucket)


SERVERS: dict[str, type[StoreServer]] = {server.kind: server
                                         for server in (AzuriteServer, MotoServer)}
"""Each store's server, by `Store.kind`."""
