"""glibc's malloc, set for a long-lived worker: few arenas, and freed memory handed back.

A burst — a hot second's callbacks built, produced and delivered, a large step of requests —
allocates tens of MB in C (librdkafka's queued messages, RocksDB's buffers) that are freed a
moment later. glibc keeps what is freed for reuse and returns to the OS only what sits at the
top of a heap, so without help the worker's resident memory stays at its highest burst for good.
Where the C library is not glibc, nothing here does anything.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

#: glibc malloc arenas the worker's threads share, unless ``MALLOC_ARENA_MAX`` says otherwise.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h

#: Resident growth since the last release after which a quiet worker releases again (bytes).
RELEASE_AFTER_BYTES = 16 * 1024 * 1024
#: How often the worker looks (seconds).
RELEASE_EVERY_S = 1.0
#: Timers accepted and fired between two looks below which the worker is quiet. Under load
#: what is freed is reused at once: releasing it would only have it faulted back in, and the
#: release holds malloc's locks against the threads that allocate meanwhile.
QUIET_BELOW = 1000


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Have glibc's malloc keep to ``arenas`` arenas; whether it was set here.

    glibc gives threads arenas of their own, up to eight per core, and what is freed in one
    arena is reused only by the threads that allocate from it: RocksDB's flush and compaction
    threads and librdkafka's each hold some, tens of megabytes of a worker's resident memory in
    all (docs/PERFORMANCE.md#10-m-pending). Set before those threads start. ``MALLOC_ARENA_MAX`` in the
    environment (which glibc reads itself) is left to decide; where the C library is not
    glibc there is nothing to set.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))


def resident_bytes() -> int:
    """This process's resident memory (bytes), or 0 where ``/proc`` does not say."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class FreedMemory:
    """Hands what malloc holds freed back to the OS (glibc's ``malloc_trim``, which releases
    the free pages inside the heaps too, not only at their top) once a burst is over: when the
    resident memory has grown by ``after_bytes`` since the last time and ``work`` (a count of
    what the process did: timers accepted and fired) moved by less than ``quiet_below`` since
    the last look."""

    def __init__(
        self,
        work: Callable[[], float],
        after_bytes: int = RELEASE_AFTER_BYTES,
        quiet_below: float = QUIET_BELOW,
    ) -> None:
        self._trim = getattr(_libc(), "malloc_trim", None)
        self._work, self._quiet_below, self._after_bytes = work, quiet_below, after_bytes
        self._worked = work()
        self._released_at = resident_bytes()

    def due(self) -> bool:
        """Whether to release now (call it at every look: it counts the work since the last)."""
        worked, self._worked = self._worked, self._work()
        quiet = self._worked - worked < self._quiet_below
        return quiet and self._trim is not None and resident_bytes() - self._released_at >= self._after_bytes

    def release(self) -> int:
        """Hand freed memory back now; the resident bytes it gave up. Blocks for a few
        milliseconds (a thread of its own keeps the event loop going meanwhile)."""
        before = resident_bytes()
        if self._trim is not None:
            self._trim(0)
        self._released_at = resident_bytes()
        return max(before - self._released_at, 0)
