"""When a job gives up instead of replacing its failed pods: one rule for both backends.

A pod that exited with the trainer's bad-input code ends the job at once (no restart fixes a
missing dataset); any other failed pod is replaced until it would exceed the restart budget.
Each backend counts restarts its own way; the rule and the reasons it gives are the same.
"""

from __future__ import annotations

from trainer.contract.process import ExitCode


def bad_input(exit_code: int | None) -> bool:
    """Whether a pod exited with the trainer's bad-input code."""
    return exit_code == ExitCode.BAD_INPUT


def over_budget(restarts: int, budget: int) -> bool:
    """Whether `restarts` restarts of one pod are more than the budget allows."""
    return restarts > budget


def bad_input_reason(pod: str, error: str | None, exit_code: int | None) -> str:
    """Why the job gave up on `pod`: its trainer's last error, else its exit code."""
    return f"pod {pod} failed: bad input: {error or f'exit code {exit_code}'}"


def budget_spent_reason(pod: str, restarts: int, exit_code: int | None,
                        cause: str | None = None) -> str:
    """Why the job gave up on `pod`, restarted `restarts` times (`cause`: how its run ended)."""
    return (f"restart budget spent: pod {pod} restarted {restarts} times, last exit code "
            f"{exit_code}" + (f" ({cause})" if cause else ""))
