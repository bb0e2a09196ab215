"""The progress display of `migrator watch` and `make demo` (api/watch.py)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from api.cli.follow import PlainDisplay, TerminalDisplay, progress_line


def job_view(status: str = "running", step: int = 10, samples_seen: int = 320,
             restarts: int = 0, phases: tuple[str, ...] = ("Running", "Running"),
             ) -> dict[str, Any]:
    """A JobPublic as the API sends it, with the fields the display reads."""
    return {"id": "job-1", "status": status,
            "progress": {"epoch": 1, "epochs": 2, "step": step, "samples_seen": samples_seen,
                         "total_samples": 1000, "eta_seconds": 75.0},
            "metrics": {"loss": 0.4123, "samples_per_second": 37.6},
            "pods": [{"ordinal": ordinal, "phase": phase, "restarts": restarts if ordinal else 0}
                     for ordinal, phase in enumerate(phases)]}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_progress_line_names_pod_phases_in_full() -> None:
    line = progress_line(job_view(restarts=1, phases=("Running", "Succeeded")))
    assert line == ("job-1 running   epoch 1/2 step 10  32.0% loss 0.412 38 samples/s "
                    "eta 0:01:15 pods [0:Running 1:Succeeded(r1)]")


def test_without_a_terminal_progress_is_a_line_every_few_seconds() -> None:
    out, clock = io.StringIO(), FakeClock()
    display = PlainDisplay(out, period=5.0, clock=clock)
    for second in range(13):  # a poll per second, a new step each time
        clock.now = second
        display.update(job_view(step=second + 1, samples_seen=32 * (second + 1)))
        if second == 7:
            display.event("  [pod] job-1-1: killed")
    clock.now = 13.0
    display.update(job_view("degraded", step=14))  # a status change shows at once
    clock.now = 14.0
    display.update(job_view("degraded", step=15))
    lines = out.getvalue().splitlines()
    assert [line.split()[5] if "step" in line else line for line in lines] == [
        "1", "6", "  [pod] job-1-1: killed", "11", "14"]
    assert "step 14" in lines[-1] and "degraded" in lines[-1]


def test_without_a_terminal_an_unchanged_line_is_not_repeated() -> None:
    out, clock = io.StringIO(), FakeClock()
    display = PlainDisplay(out, period=5.0, clock=clock)
    for second in range(0, 30, 5):
        clock.now = second
        display.update(job_view())
    assert len(out.getvalue().splitlines()) == 1


def test_on_a_terminal_progress_is_a_bar_under_the_events() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    with TerminalDisplay(console) as display:
        display.update(job_view(restarts=2))
        display.event("  [job] status running [not markup]")
    shown = screen.getvalue()
    assert "[job] status running [not markup]" in shown
    for part in ("job-1 running", "━", "32%", "epoch 1/2 step 10", "eta 0:01:15", "loss 0.412",
                 "38 samples/s", "pods 0:Running 1:Running(r2)"):
        assert part in shown, part


# A pod's message: CSI (clear, colour), OSC 52 (the clipboard), C1 CSI, a carriage return, and
# rich markup that would colour the line or (an unopened `[/]`) raise.
EVIL = "\x1b[2J\x1b[31m\x1b]52;c;cm0gLXJmIH4=\x07\x9b1mok\rFAKE [bold red]loud[/] [/oops]"


def test_on_a_terminal_what_pods_send_is_shown_not_obeyed() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=300, color_system="truecolor")
    job = job_view(phases=(EVIL,))
    job["status"] = "running [/oops]"
    with TerminalDisplay(console) as display:
        display.update(job)
        display.event(f"  [job] job-1-0: {EVIL}")
    shown = screen.getvalue()
    assert "\\x1b[2J\\x1b[31m\\x1b]52;c;cm0gLXJmIH4=\\x07\\x9b1mok\\x0dFAKE" in shown
    assert "[bold red]loud[/] [/oops]" in shown and "running [/oops]" in shown
    for sequence in ("\x1b[2J", "\x1b[31m", "\x1b]52", "\x9b"):
        assert sequence not in shown  # rich's own (cursor, colours) aside, none of the pod's
    assert "\x1b[1;31m" not in shown  # no markup: nothing made it bold and red


def test_in_a_log_what_pods_send_is_one_escaped_line() -> None:
    out = io.StringIO()
    display = PlainDisplay(out)
    display.event(f"  [job] job-1-0: {EVIL}\n  [job] succeeded")
    assert out.getvalue() == ("  [job] job-1-0: \\x1b[2J\\x1b[31m\\x1b]52;c;cm0gLXJmIH4=\\x07"
                              "\\x9b1mok\\x0dFAKE [bold red]loud[/] [/oops]\\x0a  [job] "
                              "succeeded\n")
