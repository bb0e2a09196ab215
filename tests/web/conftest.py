"""Real headless Chromium (Debian's, driven by Playwright) against a real control plane.

One control plane (`python -m api`, local backend, tiny model) and one browser serve every test
of a module; each test gets a fresh page whose console errors are collected.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import ADMIN_TOKEN
from tests.api.control_plane import ControlPlane
from tests.conftest import ROOT, Processes
from tests.factories import make_reviews_csv

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
UPLOT = ROOT / "web" / "node_modules" / "uplot" / "dist" / "uPlot.esm.js"
ARTIFACTS: list[Path] = []


def require_browser() -> None:
    """Skip without chromium or uPlot, except in CI (CI=true), where both must be there."""
    problems = []
    if not CHROMIUM.is_file():
        problems.append(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
    if not UPLOT.is_file():
        problems.append("uPlot is not installed (make setup runs npm ci in web/)")
    if problems and os.environ.get("CI") == "true":
        pytest.fail("; ".join(problems))
    if problems:
        pytest.skip("; ".join(problems))


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory,
                  tiny_model_dir: Path) -> Iterator[ControlPlane]:
    """`python -m api` on a free port, the local backend, the tiny model under its inputs dir."""
    require_browser()
    root = tmp_path_factory.mktemp("dashboard")
    inputs = root / "inputs"
    inputs.mkdir()
    (inputs / "tiny").symlink_to(tiny_model_dir)
    make_reviews_csv(inputs / "reviews.csv", rows=4000)
    processes = Processes()
    plane = ControlPlane(processes, root / "data", inputs)
    try:
        plane.start()
        yield plane
    finally:
        plane.close()
        processes.cleanup()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class Console:
    """Errors a page reported: console.error messages and uncaught exceptions."""

    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def unexpected(self, *allowed: int | str) -> list[str]:
        """Errors other than the browser's own note on a failure the test provoked: an HTTP
        status (403) or a network error (net::ERR_CONNECTION_REFUSED)."""
        notes = tuple(f"Failed to load resource: the server responded with a status of {a} "
                      if isinstance(a, int) else f"Failed to load resource: {a}" for a in allowed)
        return [e for e in self.errors if not e.startswith(notes)]


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab; at the end, no URL that any tab of its context requested (pages, API
    calls, the event stream, downloads) may have carried the admin token."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    requested: list[str] = []
    context.on("request", lambda r: requested.append(r.url))
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    console = Console()
    tab.on("console", lambda m: m.type == "error" and console.errors.append(m.text))
    tab.on("pageerror", lambda e: console.errors.append(f"uncaught: {e}"))

    def dismiss(dialog: Any) -> None:
        console.dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", dismiss)
    tab.console = console
    tab.requested = requested
    yield tab
    context.close()
    assert [url for url in requested if ADMIN_TOKEN in url or "token=" in url] == []


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DASHBOARD_ARTIFACTS if set, else a pytest temporary directory; listed after the run."""
    configured = os.environ.get("DASHBOARD_ARTIFACTS")
    directory = Path(configured) if configured else tmp_path_factory.mktemp("artifacts")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def save_artifact(page: Any, directory: Path, name: str) -> Path:
    path = directory / name
    page.screenshot(path=str(path), full_page=True)
    ARTIFACTS.append(path)
    return path


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for path in ARTIFACTS:
        terminalreporter.write_line(f"dashboard artifact: {path}")
