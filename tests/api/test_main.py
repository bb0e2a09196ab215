"""`python -m api` (api/__main__.py): its flags, the MIGRATOR_* settings, what it prints."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from api.__main__ import parse_settings
from tests.conftest import ROOT
from tests.support import free_port, has_ipv6_loopback, not_private, wait_for
from trainer.contract.runtime import host_port


def test_the_environment_wins_unless_a_flag_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIGRATOR_HOST", "0.0.0.0")
    monkeypatch.setenv("MIGRATOR_PORT", "9123")
    settings = parse_settings([])
    assert (settings.host, settings.port) == ("0.0.0.0", 9123)
    settings = parse_settings(["--port", "9000"])
    assert (settings.host, settings.port) == ("0.0.0.0", 9000)
    settings = parse_settings(["--host", "127.0.0.2", "--port", "9001"])
    assert (settings.host, settings.port) == ("127.0.0.2", 9001)


def test_without_either_the_defaults_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIGRATOR_HOST", raising=False)
    monkeypatch.delenv("MIGRATOR_PORT", raising=False)
    settings = parse_settings([])
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)


def test_an_ipv6_host_is_bracketed_in_urls() -> None:
    settings = parse_settings(["--host", "::1", "--port", "9000"])
    assert settings.base_url == "http://[::1]:9000"  # where local pods post their reports


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback (::1) here")
def test_it_serves_on_an_ipv6_address(tmp_path: Path) -> None:
    with started({"MIGRATOR_DATA_DIR": str(tmp_path)}, terminal=False, host="::1") as (
            printed, url):
        assert url.startswith("http://[::1]:") and f"control plane on {url} " in printed


@contextmanager
def started(env: dict[str, str], terminal: bool, host: str = "127.0.0.1",
            ) -> Iterator[tuple[str, str]]:
    """`python -m api` printing to a pipe or to a pseudo-terminal: what it printed on start and
    its URL, while it runs."""
    port = free_port(host)
    read_end, write_end = pty.openpty() if terminal else os.pipe()
    process = subprocess.Popen([sys.executable, "-m", "api", "--host", host, "--port", str(port)],
                               env={**os.environ, **env}, stdout=write_end,
                               stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
    os.close(write_end)
    output = b""
    try:
        deadline = time.monotonic() + 60
        # The banner, then how to log in: a login URL and where the token is on a terminal.
        while output.count(b"\n") < (3 if terminal else 2):
            assert time.monotonic() < deadline and process.poll() is None, output
            if select.select([read_end], [], [], 1)[0]:
                output += os.read(read_end, 4096)
        url = f"http://{host_port(host, port)}"

        def healthy() -> bool:
            assert process.poll() is None, output
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz").status_code == 200
            return False

        wait_for(healthy, timeout=60, what="the API to answer")
        yield output.decode(), url
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        os.close(read_end)


def logged_in(printed: str, url: str) -> str:
    """The token that the printed login URL's code buys (once)."""
    code = re.search(rf"Log in: {url}/#login=(\S+) ", printed)
    assert code, printed
    answer = httpx.post(f"{url}/api/v1/login", json={"code": code[1]})
    assert answer.status_code == 200, answer.text
    assert httpx.post(f"{url}/api/v1/login", json={"code": code[1]}).status_code == 403
    return str(answer.json()["token"])


def test_a_configured_token_is_never_printed(tmp_path: Path) -> None:
    token = "configured-token-0123456789abcdef"
    env = {"MIGRATOR_DATA_DIR": str(tmp_path), "MIGRATOR_ADMIN_TOKEN": token}
    with started(env, terminal=False) as (printed, _):
        assert token not in printed and "MIGRATOR_ADMIN_TOKEN" in printed
        assert "login=" not in printed and "migrator login-url" in printed  # a log: no code
    with started(env, terminal=True) as (printed, url):
        assert token not in printed and "MIGRATOR_ADMIN_TOKEN" in printed
        assert logged_in(printed, url) == token


def test_a_generated_token_is_printed_only_to_a_terminal_and_in_no_url(tmp_path: Path) -> None:
    env = {"MIGRATOR_DATA_DIR": str(tmp_path / "piped")}
    with started(env, terminal=False) as (printed, _):
        token = (tmp_path / "piped" / "admin_token").read_text().strip()
        assert token not in printed and str(tmp_path / "piped" / "admin_token") in printed
    assert oct((tmp_path / "piped" / "admin_token").stat().st_mode & 0o777) == "0o600"

    env = {"MIGRATOR_DATA_DIR": str(tmp_path / "terminal")}
    with started(env, terminal=True) as (printed, url):
        token = (tmp_path / "terminal" / "admin_token").read_text().strip()
        assert f"-H 'Authorization: Bearer {token}'" in printed  # for curl: a header
        assert "token=" not in printed and printed.count(token) == 1
        assert logged_in(printed, url) == token
    # The next start read it from the file, not generated it: not printed again.
    with started(env, terminal=True) as (printed, url):
        assert token not in printed and logged_in(printed, url) == token


def test_the_data_dir_is_this_users_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)  # as an earlier version left it, with the default umask
    data.chmod(0o755)
    with started({"MIGRATOR_DATA_DIR": str(data)}, terminal=False):
        assert oct(data.stat().st_mode & 0o777) == "0o700"
        made = {path.name for path in data.iterdir()}
        assert {"admin_token", "migrator.db", "migrator.db-wal", "migrator.db-shm"} <= made
        assert not_private(data) == []
