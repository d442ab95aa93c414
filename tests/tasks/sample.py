"""Tasks the task worker runs in tests: each records its call in a file named by the environment."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from futures.tasks import TaskRegistry

tasks = TaskRegistry()


def _log(entry: dict[str, object]) -> None:
    with Path(os.environ["TASKS_LOG"]).open("a") as out:
        out.write(json.dumps({**entry, "at_ms": time.time_ns() // 1_000_000}) + "\n")


@tasks.register("send-reminder")
def send_reminder(user_id: str, text: str, *, urgent: bool = False) -> None:
    _log({"task": "send-reminder", "args": [user_id, text], "urgent": urgent})


@tasks.register("always-fails", max_retries=1, backoff_s=0.5)
def always_fails(n: int) -> None:
    _log({"task": "always-fails", "n": n})
    raise RuntimeError(f"boom {n}")
