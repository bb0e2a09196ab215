"""A real Hugging Face hub for the tests: olah (a hub mirror; pinned in tests/hub/requirements.txt,
in a virtual environment of its own, tests/hub/.venv, which `make test-setup` makes), offline,
serving local git repositories on a free 127.0.0.1 port, stopped by pid.

A test adds repositories from local directories (`add_model`, `add_dataset`: each becomes a git
repository with one commit on `main`, under `<root>/mirrors/models|datasets/<org>/<name>`, the
layout olah's `mirrors-path` reads) and points a client at `endpoint` (huggingface_hub's
`endpoint=` argument, or `HF_ENDPOINT` in a new process). Repositories may be added before or
after `start`: olah looks for them on disk at every request and keeps nothing of them (a repo
asked for before it was added answers 404, and after, its files; a new commit on `main` is
served at once). Clients ask for `revision="main"`: olah offline answers `model_info` without a
revision with a 401, as for a private repo (snapshot_download asks for `main` by default).

`fetches()` reads, from olah's access log, every file it served: a test can count downloads.

In this process huggingface_hub read HF_HUB_OFFLINE=1 (tests/conftest.py) and HF_ENDPOINT when
it was imported: a test calling it here passes `endpoint=` and turns its offline mode off with
monkeypatch (`huggingface_hub.constants.HF_HUB_OFFLINE`); a process started afterwards is given
HF_ENDPOINT and HF_HUB_OFFLINE=0 (otherwise it inherits HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import NamedTuple

import psutil

from tests.stores import _kill_tree, _log_tail, _wait_until_listening
from tests.support import ThrowawayServer, free_port, wait_for

OLAH_PYTHON = Path(__file__).resolve().parent / ".venv/bin/python"
"""Where `make test-setup` puts olah's Python."""

AUTHOR = ("Hub Mirror", "hub-mirror@tests.invalid")
COMMIT_DATE = "2024-01-01T00:00:00+00:00"
"""Every repository's one commit is by this author at this date: the same files make the same
commit hash."""

STOP_TIMEOUT = 10.0
"""Seconds olah has to end after SIGTERM (it takes about 0.2) before it gets SIGKILL."""

# uvicorn's access log line for a file: `"GET /<org>/<name>/resolve/<revision>/<path> HTTP/1.1"
# 200 OK`, with `datasets/` first for a dataset; HEAD requests (the client's metadata) are not
# downloads, nor are answers other than 2xx.
_RESOLVE = re.compile(r'"GET /((?:datasets/)?[^/\s"]+/[^/\s"]+)/resolve/[^/\s"]+/([^\s"?]+)'
                      r'(?:\?[^\s"]*)? HTTP/[\d.]+" 2\d\d\b')


class Fetch(NamedTuple):
    """One file olah served: `repo` as in the hub's URLs (`org/name` for a model,
    `datasets/org/name` for a dataset) and `file`, its path in the repository."""

    repo: str
    file: str


def _git(args: list[str], cwd: Path) -> str:
    """git in `cwd`, blind to the machine's and the user's configuration (hooks, signing,
    LFS filters, ignore files), its dates fixed."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_AUTHOR_DATE": COMMIT_DATE, "GIT_COMMITTER_DATE": COMMIT_DATE}
    result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed in {cwd}: {result.stderr.strip()}")
    return result.stdout.strip()


def _running(process: psutil.Process) -> bool:
    """Whether `process` still runs (a zombie has ended: only its reaping is left)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


class HubMirror(ThrowawayServer):
    """olah, offline, serving the repositories added under `root` (which it does not delete:
    in a test's tmp_path, its log stays for a failure's post-mortem)."""

    missing = "olah is not installed (make test-setup: tests/hub/.venv)"

    def __init__(self, root: Path, python: Path = OLAH_PYTHON) -> None:
        self.python = python
        self.root = root
        self.mirrors = root / "mirrors"
        self.log = root / "olah.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.mirrors.mkdir(parents=True, exist_ok=True)

    @classmethod
    def installed(cls) -> Path | None:
        """olah's Python, if `make test-setup` installed it."""
        return OLAH_PYTHON if OLAH_PYTHON.is_file() else None

    @property
    def endpoint(self) -> str:
        """What HF_ENDPOINT (or huggingface_hub's `endpoint=`) is set to."""
        return f"http://127.0.0.1:{self.port}"

    def add_model(self, repo_id: str, source: Path) -> str:
        """Serve the files under `source` as the model `repo_id` (`org/name`); the commit hash."""
        return self._add("models", repo_id, source)

    def add_dataset(self, repo_id: str, source: Path) -> str:
        """Serve the files under `source` as the dataset `repo_id` (`org/name`); the commit
        hash."""
        return self._add("datasets", repo_id, source)

    def _add(self, kind: str, repo_id: str, source: Path) -> str:
        org, _, name = repo_id.partition("/")
        if not org or not name or "/" in name:
            raise ValueError(f"a repo id is org/name, not {repo_id!r}")
        repo = self.mirrors / kind / org / name
        # A copy (links followed): the files as they are now, whatever becomes of `source`.
        shutil.copytree(source, repo, ignore=shutil.ignore_patterns(".git"))
        _git(["init", "--quiet", "--initial-branch=main"], repo)
        _git(["add", "--all", "--force"], repo)
        _git(["-c", f"user.name={AUTHOR[0]}", "-c", f"user.email={AUTHOR[1]}", "commit",
              "--quiet", "--no-verify", "--message", f"{repo_id} for the tests"], repo)
        return _git(["rev-parse", "HEAD"], repo)

    def _config(self) -> Path:
        """olah's TOML (JSON's strings are TOML's basic strings)."""
        netloc = json.dumps(f"127.0.0.1:{self.port}")
        config = self.root / "olah.toml"
        config.write_text(
            "[basic]\n"
            'host = "127.0.0.1"\n'
            f"port = {self.port}\n"
            f"mirror-netloc = {netloc}\n"
            f"mirror-lfs-netloc = {netloc}\n"
            f"mirrors-path = [{json.dumps(str(self.mirrors))}]\n"
            f"repos-path = {json.dumps(str(self.root / 'cache'))}\n"
            "\n[accessibility]\n"
            "offline = true\n")
        return config

    def _start(self) -> None:
        """Start olah and wait until it listens (uvicorn listens once the app has started)."""
        argv = [str(self.python), "-m", "olah.server", "--config", str(self._config()),
                "--log-path", str(self.root / "logs")]
        # HOME: olah's ~/.olah (a database it may create) stays in here.
        env = {**os.environ, "HOME": str(self.root), "PYTHONUNBUFFERED": "1"}
        with self.log.open("wb") as handle:
            self.process = subprocess.Popen(argv, cwd=self.root, env=env,
                                            stdin=subprocess.DEVNULL, stdout=handle,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        _wait_until_listening(self.process, self.port, "olah", self.log)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not ended within STOP_TIMEOUT; then SIGKILL to what it
        started (GitPython's `git cat-file` processes, which end by themselves once it has:
        their new parent, PID 1, may take a second or two to reap them, which is not waited
        for)."""
        process, self.process = self.process, None
        if process is None:
            return
        children: list[psutil.Process] = []
        with contextlib.suppress(psutil.NoSuchProcess):
            children = psutil.Process(process.pid).children(recursive=True)
        process.terminate()  # a no-op once it has exited (a failed start)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_tree(process)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        wait_for(lambda: not any(map(_running, children)), what="olah's git processes to end",
                 timeout=20)

    def fetches(self) -> list[Fetch]:
        """Every file olah served so far, in order (a file downloaded twice is there twice)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [Fetch(match[1], urllib.parse.unquote(match[2]))
                for match in _RESOLVE.finditer(text)]

    def log_tail(self) -> str:
        """The end of olah's log, for an assertion's message."""
        return _log_tail(self.log)
