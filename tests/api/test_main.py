"""`python -m api` (api/__main__.py): its flags and the MIGRATOR_* settings."""

from __future__ import annotations

import pytest

from api.__main__ import parse_settings


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
