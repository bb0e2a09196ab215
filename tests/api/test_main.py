"""`python -m api` (api/__main__.py): its flags, the MIGRATOR_* settings, what it prints."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.__main__ import parse_settings
from tests.conftest import ROOT
from tests.support import free_port, not_private


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


def test_an_ipv6_host_is_bracketed_in_urls(tmp_path: Path) -> None:
    settings = parse_settings(["--host", "::1", "--port", "9000"])
    assert settings.base_url == "http://[::1]:9000"  # where local pods post their reports
    printed = first_lines(["--host", "::1", "--port", "9000"],
                          {"MIGRATOR_DATA_DIR": str(tmp_path)}, terminal=False)
    assert "control plane on http://[::1]:9000 " in printed


def first_lines(args: list[str], env: dict[str, str], terminal: bool) -> str:
    """What `python -m api` prints on start, to a pipe or to a pseudo-terminal."""
    read_end, write_end = pty.openpty() if terminal else os.pipe()
    process = subprocess.Popen([sys.executable, "-m", "api", "--port", str(free_port()), *args],
                               env={**os.environ, **env}, stdout=write_end,
                               stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
    os.close(write_end)
    output = b""
    try:
        deadline = time.monotonic() + 60
        while output.count(b"\n") < 2:  # the banner, then where the token is
            assert time.monotonic() < deadline and process.poll() is None, output
            if select.select([read_end], [], [], 1)[0]:
                output += os.read(read_end, 4096)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        os.close(read_end)
    return output.decode()


def test_a_configured_token_is_never_printed(tmp_path: Path) -> None:
    token = "configured-token-0123456789abcdef"
    env = {"MIGRATOR_DATA_DIR": str(tmp_path), "MIGRATOR_ADMIN_TOKEN": token}
    for terminal in (False, True):
        printed = first_lines([], env, terminal)
        assert token not in printed and "MIGRATOR_ADMIN_TOKEN" in printed


def test_a_generated_token_is_printed_only_to_a_terminal(tmp_path: Path) -> None:
    env = {"MIGRATOR_DATA_DIR": str(tmp_path / "piped")}
    printed = first_lines([], env, terminal=False)
    token = (tmp_path / "piped" / "admin_token").read_text().strip()
    assert token not in printed and str(tmp_path / "piped" / "admin_token") in printed
    assert oct((tmp_path / "piped" / "admin_token").stat().st_mode & 0o777) == "0o600"

    env = {"MIGRATOR_DATA_DIR": str(tmp_path / "terminal")}
    printed = first_lines([], env, terminal=True)
    token = (tmp_path / "terminal" / "admin_token").read_text().strip()
    assert f"/?token={token}" in printed
    # The next start read it from the file, not generated it: not printed again.
    assert token not in first_lines([], env, terminal=True)


def test_the_data_dir_is_this_users_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)  # as an earlier version left it, with the default umask
    data.chmod(0o755)
    first_lines([], {"MIGRATOR_DATA_DIR": str(data)}, terminal=False)
    assert oct(data.stat().st_mode & 0o777) == "0o700"
    made = {path.name for path in data.iterdir()}
    assert {"admin_token", "migrator.db"} <= made
    assert not_private(data) == []
