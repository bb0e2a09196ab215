"""Real headless Chromium (Debian's, driven by Playwright) against a real control plane.

One control plane (`python -m api`, local backend, tiny model) and one browser serve every test
of a module; each test gets a fresh page whose console errors are collected.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.backends.local import LocalBackend
from tests.api.conftest import ADMIN_TOKEN, AUTH
from tests.api.live import free_port
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


def wait_for(condition: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


class ControlPlane:
    """`python -m api` on a free port, the local backend, the tiny model under its inputs dir."""

    def __init__(self, processes: Processes, root: Path, tiny_model: Path) -> None:
        self.processes, self.data_dir = processes, root / "data"
        self.inputs_dir = root / "inputs"
        self.inputs_dir.mkdir(parents=True)
        (self.inputs_dir / "tiny").symlink_to(tiny_model)
        make_reviews_csv(self.inputs_dir / "reviews.csv", rows=4000)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.http = httpx.Client(base_url=self.url, headers=AUTH, timeout=30)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {"MIGRATOR_DATA_DIR": str(self.data_dir), "MIGRATOR_ADMIN_TOKEN": ADMIN_TOKEN,
               "MIGRATOR_INPUTS_DIR": str(self.inputs_dir), "MIGRATOR_RECONCILE_INTERVAL": "0.3"}
        self.process = process = self.processes.start(
            [sys.executable, "-m", "api", "--port", self.url.rsplit(":", 1)[1]], env,
            self.data_dir.parent / "api.log")

        def healthy() -> bool:
            assert process.poll() is None, "the API exited; see api.log"
            with contextlib.suppress(httpx.HTTPError):
                return self.http.get("/healthz").status_code == 200
            return False

        wait_for(healthy, 60, "the API to start")

    def restart(self) -> None:
        """SIGKILL the API (its jobs live on under their supervisors) and start it again."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.start()

    def report_token(self, job_id: str) -> str:
        """The job's report token, from the local backend's launch record."""
        launch = json.loads((self.data_dir / "jobs" / job_id / "launch.json").read_text())
        return str(launch["report_token"])

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def stop(self) -> None:
        self.http.close()
        backend = LocalBackend(self.data_dir / "jobs")
        for job_dir in (self.data_dir / "jobs").glob("job-*"):
            backend.delete(job_dir.name)
        self.processes.cleanup()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory,
                  tiny_model_dir: Path) -> Iterator[ControlPlane]:
    require_browser()
    plane = ControlPlane(Processes(), tmp_path_factory.mktemp("dashboard"), tiny_model_dir)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


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
    context = browser.new_context(viewport={"width": 1280, "height": 900})
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
    yield tab
    context.close()


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
