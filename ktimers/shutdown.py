"""Graceful stop on SIGTERM (how Kubernetes stops a pod) and SIGINT (Ctrl-C)."""

from __future__ import annotations

import signal
from types import FrameType


class StopFlag:
    """Set by SIGTERM/SIGINT; main loops poll it. A plain attribute: a signal handler
    must not take locks (``threading.Event.set`` does, and the interrupted main
    thread may hold it)."""

    def __init__(self) -> None:
        self.reason: str | None = None

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason

    def install(self) -> None:
        def handle(signum: int, _frame: FrameType | None) -> None:
            self.request(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
