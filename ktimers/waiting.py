"""Waiting for the brokers and the topics a service needs, instead of exiting without them.

A service started before its brokers answer (a cluster restarting, a pod scheduled first)
or before its topics exist (a topic operator that has not run yet) logs one line saying
what it waits for, retries with back-off, and goes on once they are there. What waiting
cannot fix, a topic layout that is wrong or a bad setting, is raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ktimers.errors import BrokersUnreachableError, MissingTopicError, TimersError

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Seconds between two attempts: ``first_s``, doubling up to ``max_s``."""

    first_s: float = 0.5
    max_s: float = 5.0

    def delays(self) -> Callable[[], float]:
        delay = self.first_s

        def next_delay() -> float:
            nonlocal delay
            current, delay = delay, min(self.max_s, delay * 2)
            return current

        return next_delay


#: What a service waits for; anything else raised by the check is not waited out.
WAITED_FOR: tuple[type[TimersError], ...] = (BrokersUnreachableError, MissingTopicError)


def wait_for(
    check: Callable[[], T],
    *,
    who: str,
    log: logging.Logger,
    stopped: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[str], None] = lambda reason: None,
    backoff: Backoff = Backoff(),
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """``check()`` once it succeeds; None if ``stopped()`` first.

    While it raises :data:`WAITED_FOR` errors, waits (``sleep``, in slices short enough to
    notice a stop) and tries again with ``backoff``; logs one line when the wait begins or
    its reason changes kind (brokers, then topics), and one when it is over. ``on_wait``
    hears every reason, for a readiness probe to show. Other errors propagate.
    """
    next_delay = backoff.delays()
    started = clock()
    waiting_for: type[TimersError] | None = None
    while not stopped():
        try:
            result = check()
        except WAITED_FOR as exc:
            on_wait(str(exc))
            if type(exc) is not waiting_for:
                waiting_for = type(exc)
                log.warning("%s waiting: %s (retrying every %gs at most)", who, exc, backoff.max_s)
            deadline = clock() + next_delay()
            while not stopped() and (left := deadline - clock()) > 0:
                sleep(min(left, 0.1))
            continue
        if waiting_for is not None:
            log.info("%s: brokers and topics are there after %.1fs of waiting", who, clock() - started)
        return result
    return None
