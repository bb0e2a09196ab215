"""Following a job from the command line: its events as lines, its progress as a live bar on a
terminal (rich) or, when the output is a log, as a plain line at most every few seconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.text import Text

from api.cli.client import Client
from api.cli.terminal import echo, printable

FINISHED = ("succeeded", "failed", "cancelled")
EVENT_TYPES = ["job", "pod", "checkpoint"]
PLAIN_PERIOD = 5.0
"""Seconds between two progress lines in a log (a line per step would bury the events)."""


def pod_phases(job: dict[str, Any]) -> str:
    return " ".join(f"{p['ordinal']}:{p['phase']}" + (f"(r{p['restarts']})" if p["restarts"]
                                                      else "") for p in job["pods"])


def eta_text(seconds: float | None) -> str:
    if not seconds:
        return ""
    minutes, secs = divmod(round(seconds), 60)
    return f"eta {minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def position_text(job: dict[str, Any]) -> str:
    progress = job["progress"]
    return f"epoch {progress['epoch']}/{progress['epochs']} step {progress['step']}"


def training_text(job: dict[str, Any]) -> str:
    """Loss and speed, when the pods reported them."""
    metrics = job["metrics"]
    parts = []
    if "loss" in metrics:
        parts.append(f"loss {metrics['loss']:.3f}")
    if "samples_per_second" in metrics:
        parts.append(f"{metrics['samples_per_second']:.0f} samples/s")
    return " ".join(parts)


def progress_line(job: dict[str, Any]) -> str:
    """The job in one line: status, epoch, step, share done, loss, speed, ETA and pod phases."""
    progress = job["progress"]
    total = progress["total_samples"]
    share = f"{100 * progress['samples_seen'] / total:5.1f}%" if total else "  ...%"
    parts = [job["id"], f"{job['status']:<9}", position_text(job), share, training_text(job),
             eta_text(progress.get("eta_seconds")), f"pods [{pod_phases(job)}]"]
    return " ".join(part for part in parts if part)


def event_line(event: dict[str, Any]) -> str:
    data = event["data"]
    text = data.get("message") or f"checkpoint {data.get('path')} (step {data.get('step')})"
    source = f"{data['pod']}: " if "pod" in data else ""
    return f"  [{event['type']}] {source}{text}"


class Display(Protocol):
    def __enter__(self) -> Display: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...

    def event(self, line: str) -> None: ...

    def update(self, job: dict[str, Any]) -> None: ...


class PlainDisplay:
    """For a log: every event line, and the progress line when the status changes or, when it
    changed otherwise, at most every `period` seconds."""

    def __init__(self, out: TextIO | None = None, period: float = PLAIN_PERIOD,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out, self.period, self.clock = out, period, clock
        self.status: str | None = None
        self.shown = ""
        self.shown_at: float | None = None

    def __enter__(self) -> PlainDisplay:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        pass

    def event(self, line: str) -> None:
        self._print(line)

    def update(self, job: dict[str, Any]) -> None:
        line, now = progress_line(job), self.clock()
        due = self.shown_at is None or now - self.shown_at >= self.period
        if job["status"] != self.status or (due and line != self.shown):
            self._print(line)
            self.shown, self.shown_at = line, now
        self.status = job["status"]

    def _print(self, line: str) -> None:
        echo(line, file=self.out)


class TerminalDisplay:
    """For a terminal: event lines scroll above a live bar with the share done, epoch, step and
    ETA, and a line with loss, samples/s and the pods' phases under it."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        # Text from the API is never rich markup (`[red]`, or a `[/]` that raises).
        self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                            TaskProgressColumn(),
                            TextColumn("{task.fields[position]}", markup=False),
                            TextColumn("{task.fields[eta]}", markup=False), console=self.console)
        self.task = self.bar.add_task("", total=None, position="", eta="")
        self.details = Text()
        self.live = Live(Group(self.bar, self.details), console=self.console,
                         refresh_per_second=4)

    def __enter__(self) -> TerminalDisplay:
        self.live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.live.stop()

    def event(self, line: str) -> None:
        self.live.console.print(Text(printable(line)))  # Text: never markup

    def update(self, job: dict[str, Any]) -> None:
        progress = job["progress"]
        total = progress["total_samples"]
        done = progress["samples_seen"]
        if job["status"] == "succeeded" and total:
            done = total
        self.bar.update(self.task, description=printable(f"{job['id']} {job['status']}"),
                        total=total, completed=done, position=printable(position_text(job)),
                        eta=eta_text(progress.get("eta_seconds")))
        self.details.plain = printable("  ".join(
            part for part in (training_text(job), f"pods {pod_phases(job)}") if part))
        self.live.refresh()


def default_display() -> Display:
    console = Console()
    return TerminalDisplay(console) if console.is_terminal else PlainDisplay()


def watch(client: Client, job_id: str, interval: float = 1.0,
          display: Display | None = None) -> dict[str, Any]:
    """Show the job's events and progress until it finishes; return the finished job."""
    after = 0
    with display or default_display() as shown:
        while True:
            # The job first: when it reads finished, the events read next include its last ones.
            job: dict[str, Any] = client.request("GET", f"/api/v1/jobs/{job_id}")
            while True:
                page = client.request("GET", f"/api/v1/jobs/{job_id}/events",
                                      params={"after": after, "type": EVENT_TYPES})
                for event in page["data"]:
                    after = event["id"]
                    shown.event(event_line(event))
                if page["next_after"] is None:
                    break
            shown.update(job)
            if job["status"] in FINISHED:
                return job
            time.sleep(interval)
