"""The console scripts (pyproject.toml's ``[project.scripts]``).

Each imports its command only when it runs (:func:`ktimers.cli.run_command`): a command
whose extra is not installed then names the extra to install instead of failing with a
``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

from ktimers.cli import run_command


def timers() -> int:
    return run_command("timers", "", "futures.cli")


def worker() -> int:
    return run_command("timers-worker", "worker", "futures.worker.main")


def oscillator() -> int:
    return run_command("timers-oscillator", "oscillator", "oscillator.main")


def tasks() -> int:
    return run_command("timers-tasks", "", "futures.tasks.worker")


def compact() -> int:
    return run_command("timers-compact", "jobs", "futures.jobs.compact")


def replay() -> int:
    return run_command("timers-replay", "jobs", "futures.jobs.replay")


def report() -> int:
    return run_command("timers-report", "jobs", "futures.jobs.report")
