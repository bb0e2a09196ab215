from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from api.backends.local.template import Template
from tests.factories import make_reviews_csv, make_tiny_model, tiny_spec
from tests.hub.mirror import HubMirror
from tests.hub.uploads import UploadHub
from tests.postgres import PostgresServer, server_bin
from tests.stores import SERVERS, Store
from tests.support import ReportServer, free_port
from trainer.config import JobSpec, Runtime, TrainConfig
from trainer.contract.artifact_store import location
from trainer.forkclient import ForkClient, ForkedProcess

ROOT = Path(__file__).resolve().parent.parent
# No test may reach the Hugging Face hub (there is no network here); fail fast instead.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One thread per process for torch, read when it is first imported (after this): the suite's
# two workers share two cores with the trainer processes their tests start, and an idle OpenMP
# thread spins for a while. Beside two busy processes, tests/trainer/test_train.py took 41 s
# with two threads and 18 s with one. (Pods set theirs: the local backend's, the tests' own.)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch writes its compile cache's directory into the environment of a process that loads a
# model: set it before, so the trainers a test starts later see what the session's fork server
# saw, and fork (trainer.forkserver) instead of starting as a fresh, slower interpreter.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".pytest_cache" / "inductor"))
# Ctrl-C interrupts the suite, and every process it starts takes SIGINT as at a terminal (the
# demo's Ctrl-C test sends it), even where the suite was started with SIGINT ignored, as a
# shell's background job is: an ignored signal stays ignored across exec, a handled one does not.
signal.signal(signal.SIGINT, signal.default_int_handler)


def unavailable(message: str) -> NoReturn:
    """A server the tests need is not installed: skip them, but fail under CI, which installs
    everything (`make test-setup`), so that a broken installation cannot pass as skipped tests."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (a database per test: `create_database`)."""
    bin_dir = server_bin()
    if bin_dir is None:  # .ci/run installs it
        unavailable("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()


def _serve(kind: str) -> Iterator[Store]:
    """The `kind` of store's server for the session (a container or bucket per test)."""
    server = SERVERS[kind]
    binary = server.installed()
    if binary is None:
        unavailable(server.missing)
    running = server(binary).start()
    yield running.store()
    running.stop()


# One session fixture per server (`<kind>_server`), started only if a test asks for it.
@pytest.fixture(scope="session")
def azure_server() -> Iterator[Store]:
    """Azurite's blob service for the session."""
    yield from _serve("azure")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Store]:
    """moto's S3 server for the session."""
    yield from _serve("s3")


@pytest.fixture(params=list(SERVERS))
def object_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                 ) -> Iterator[Store]:
    """Each object store in turn (tests.stores.SERVERS), its variables in os.environ for this test,
    where the client libraries look. fsspec keeps filesystems by their arguments, not by the
    environment they read: those made here are forgotten afterwards, so that no later test
    gets one bound to this server."""
    chosen: Store = request.getfixturevalue(f"{request.param}_server")
    for name, value in chosen.env.items():
        monkeypatch.setenv(name, value)
    filesystem = type(location(f"{chosen.url_prefix}container").fs)
    filesystem.clear_instance_cache()
    yield chosen
    filesystem.clear_instance_cache()


@pytest.fixture
def hub_mirror(tmp_path: Path) -> Iterator[HubMirror]:
    """olah, a Hugging Face hub mirror, offline, for this test (tests/hub/mirror.py): started,
    at `endpoint`, serving the repos the test adds (`add_model`, `add_dataset`); its files and
    log in tmp_path/hub."""
    if HubMirror.installed() is None:
        unavailable(HubMirror.missing)
    mirror = HubMirror(tmp_path / "hub").start()
    yield mirror
    mirror.stop()


@pytest.fixture
def upload_hub(tmp_path: Path) -> Iterator[UploadHub]:
    """A hub that takes uploads (tests/hub/uploads.py), for this test: started at `endpoint`,
    taking `token`; what was pushed under tmp_path/upload-hub."""
    hub = UploadHub(tmp_path / "upload-hub").start()
    yield hub
    hub.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_model_no_dropout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-nodrop", dropout=0.0)


@pytest.fixture
def inputs_dir(tmp_path: Path, tiny_model_dir: Path, tiny_model_no_dropout: Path) -> Path:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "tiny").symlink_to(tiny_model_dir)
    (inputs / "tiny-nodrop").symlink_to(tiny_model_no_dropout)
    make_reviews_csv(inputs / "reviews.csv", rows=200)
    return inputs


@pytest.fixture
def make_config(tmp_path: Path, inputs_dir: Path):
    """A TrainConfig for the tiny model and dataset, with per-test directories."""

    def build(**spec: object) -> TrainConfig:
        runtime = Runtime(job_id="test", pod_name="test-0", inputs_dir=inputs_dir,
                          cache_dir=tmp_path / "cache", checkpoint_dir=tmp_path / "checkpoints",
                          model_dir=tmp_path / "model")
        return TrainConfig(JobSpec.model_validate(
            # One replica: the process trains the whole global batch, as one pod of a
            # one-replica job does.
            tiny_spec(**{"epochs": 2, "checkpoint_every_steps": 5, "replicas": 1, **spec})),
            runtime)

    return build


FORKED = {"trainer": ("peft", "trainer.lora", "trainer.pipeline"), "api": ("api.__main__",)}
"""The programs forked from a fork server of the session (`trainer`: any of the trainer's
modules; `api`: `python -m api` alone), and what each one's server imports beyond a trainer's
own."""


class Forks:
    """The session's fork servers (trainer.forkserver), one per program the tests start often:
    trainer processes, as the local backend starts pods, and control planes (`python -m api`,
    which imports for seconds on a loaded machine); each started when its first is."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.clients: dict[str, ForkClient] = {}
        self._template: Template | None = None

    def template(self) -> Path:
        """The socket of the session's fork-server template, as `python -m api` starts its own
        (api.backends.local.template): its control planes' jobs fork their servers from it."""
        if self._template is None:
            from api.backends.local.watchdog import child_env

            self._template = Template(child_env(), self.log_dir / "fork-template.log")
        return self._template.socket

    def template_process(self) -> subprocess.Popen[bytes]:
        self.template()
        assert self._template is not None
        return self._template.process

    def get(self, program: str) -> ForkClient:
        if program not in self.clients:
            self.clients[program] = ForkClient.spawn(
                dict(os.environ), ROOT, self.log_dir / f"forkserver-{program}.log",
                FORKED[program])
        return self.clients[program]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        if self._template is not None:
            self._template.close()


@pytest.fixture(scope="session")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    started = Forks(tmp_path_factory.mktemp("forks"))
    yield started
    started.close()


Process = subprocess.Popen[bytes] | ForkedProcess


class Processes:
    """Processes a test started; each is killed (by pid, with its group) at teardown. Given
    `forks`, trainer programs (`python -m trainer...`) and control planes (`python -m api`) are
    forks of the session's fork servers."""

    def __init__(self, forks: Forks | None = None) -> None:
        self.forks = forks
        self.started: list[Process] = []

    def start(self, args: list[str], env: dict[str, str], log: Path) -> Process:
        module = args[2] if args[:2] == [sys.executable, "-m"] else ""
        program = "trainer" if module.split(".")[0] == "trainer" else module
        if program in FORKED and self.forks is not None:
            log.write_bytes(b"")
            client = self.forks.get(program)
            if (pid := client.fork(args, {**os.environ, **env}, ROOT, log)) is not None:
                forked = ForkedProcess(client, pid)
                self.started.append(forked)
                return forked
        handle = log.open("wb")
        process = subprocess.Popen(args, env={**os.environ, **env}, stdout=handle,
                                   stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        handle.close()
        self.started.append(process)
        return process

    def trainer(self, args: list[str], log: Path, env: dict[str, str] | None = None,
                ) -> Process:
        return self.start([sys.executable, "-m", "trainer", *args], env or {}, log)

    def world(self, args: list[str], logs: list[Path], env: dict[str, str] | None = None,
              rank_env: list[dict[str, str]] | None = None) -> list[tuple[Process, Path]]:
        """`args` started as each rank of one static torch.distributed world (env://, on a
        free port), rank r's output in `logs[r]`, with `rank_env[r]` beside `env`."""
        common = {"WORLD_SIZE": str(len(logs)), "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port()), **(env or {})}
        return [(self.start(args, {**common, "RANK": str(rank),
                                   **(rank_env[rank] if rank_env else {})}, log), log)
                for rank, log in enumerate(logs)]

    def cleanup(self) -> None:
        for process in self.started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def outputs(ranks: list[tuple[Process, Path]], timeout: float) -> list[str]:
    """Each process's output once all have exited; one that failed fails the test with its own."""
    for process, log in ranks:
        assert process.wait(timeout=timeout) == 0, log.read_text()
    return [log.read_text() for _, log in ranks]


@pytest.fixture
def sink() -> Iterator[ReportServer]:
    """A stand-in for the API's report endpoint, for pods started without a control plane."""
    server = ReportServer().start()
    yield server
    server.stop()


@pytest.fixture
def processes(forks: Forks) -> Iterator[Processes]:
    tracker = Processes(forks)
    yield tracker
    tracker.cleanup()
