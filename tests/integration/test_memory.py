"""What the worker holds to fire timers is bounded by bytes, whatever the payloads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from futures.client import TimerSpec
from futures.worker.table import BLOCK_CACHE_BYTES, MEMTABLES_BYTES
from tests.integration.conftest import Stack
from tests.processes import Service
from tools.stack import ADVANCED_TICKS

pytestmark = pytest.mark.integration

#: The setting that bounds what the worker holds for firing, and the bound this test sets.
BUDGET_ENV = "TIMERS_FIRE_BUDGET_BYTES"
BUDGET_BYTES = 16 * 1024 * 1024
#: One hot second: TIMERS timers of PAYLOAD_BYTES each, 16 times the budget. The embedded broker
#: keeps every record in memory, each payload three times (request, changelog, callback).
TIMERS, PAYLOAD_BYTES = 4000, 64 * 1024
#: Memory the worker may add while it fires, besides the budget: the tables' shared RocksDB block
#: cache (32 MiB, filled by the scan), the Kafka clients' buffers and the allocators' slack.
#: Measured: +39 MiB in all with a 16 MiB budget, +743 MiB with a 1 GiB one.
ALLOWANCE_BYTES = 64 * 1024 * 1024
#: What the worker gives back at rest after that hot second, at least. Measured: ~10 MiB (the
#: block cache it filled stays), and nothing without the release.
RETURNED_BYTES = 4 * 1024 * 1024


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (``VmRSS``) or its peak so far (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


class PeakRss(threading.Thread):
    """Samples a process's resident memory every few milliseconds; keeps the highest."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self._pid = pid
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.01):
            try:
                self.peak = max(self.peak, rss_bytes(self._pid))
            except (OSError, AssertionError):
                return  # the process is gone

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


class Growth:
    """How far a process's resident memory rises above where it is now: sampled, and the kernel's
    exact high-water mark once that is past the one the process had already reached."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.before = rss_bytes(pid)
        self._high_before = rss_bytes(pid, "VmHWM")
        self._sampler = PeakRss(pid)
        self._sampler.start()

    def stop(self) -> int:
        """The highest resident memory since, in bytes, above that at the start."""
        high = rss_bytes(self._pid, "VmHWM")
        peak = max(self._sampler.stop(), high if high > self._high_before else 0)
        return max(peak - self.before, 0)


def start_with_budget(stack: Stack) -> Service:
    """The worker, with the test's budget and payloads of PAYLOAD_BYTES allowed, and an oscillator."""
    stack.env[BUDGET_ENV] = str(BUDGET_BYTES)
    stack.env["TIMERS_MAX_PAYLOAD_BYTES"] = str(PAYLOAD_BYTES + 1024)
    worker = stack.start_worker()
    stack.start_oscillator()
    return worker


def schedule_large(stack: Stack, topic: str, count: int, due_s: float) -> set[str]:
    """``count`` timers of PAYLOAD_BYTES, due at ``due_s`` (epoch s), sent in batch records of 10;
    their ids."""
    payloads = [bytes([i]) * PAYLOAD_BYTES for i in range(256)]
    specs = (TimerSpec(topic, f"k{i}", payloads[i % 256], at=due_s) for i in range(count))
    with stack.client() as client:
        return {h.id for h in client.schedule_many(specs, batch_size=10)}


MIB = 1024 * 1024


def test_a_hot_second_of_large_payloads_stays_within_the_budget(stack: Stack) -> None:
    worker = start_with_budget(stack)
    reader = stack.callback_topic("memory")
    started = time.monotonic()
    # After ~9 s of ingest and ~5 s of restart; on a busy machine, with RocksDB compacting the
    # burst beside them, up to 30 s were seen.
    due_at = int(time.time()) + 45
    ids = schedule_large(stack, reader.topic, TIMERS, due_at)
    stack.wait_for_metric("timers_pending", lambda v: v == TIMERS, timeout_s=40)
    ingested_s = time.monotonic() - started

    # A fresh process fires them: what ingest left in its heap cannot hide what firing takes.
    worker.stop()
    stack.start_worker()
    restarted_s = time.monotonic() - started
    assert time.time() < due_at - 2, f"ingest and restart took {restarted_s:.0f}s: the timers are due already"
    time.sleep(due_at - 2 - time.time())
    growth = Growth(worker.pid)

    fired: Counter[str] = Counter()
    early = 0
    deadline = time.monotonic() + 60
    while len(fired) < TIMERS and time.monotonic() < deadline:
        for callback in reader.poll(0.5):
            fired[callback.timer_id] += 1
            early += callback.fired_ms < due_at * 1000
            assert callback.value is not None and len(callback.value) == PAYLOAD_BYTES
            callback.value = None  # hundreds of MiB in this process otherwise
    last_s = time.time() - due_at
    grew = growth.stop()
    # Once the worker is idle again it hands back what the hot second freed, rather than hold
    # its peak for good (futures/worker/malloc.py).
    peak = growth.before + grew
    rest_deadline = time.monotonic() + 20
    while (rest := rss_bytes(worker.pid)) > peak - RETURNED_BYTES and time.monotonic() < rest_deadline:
        time.sleep(0.5)
    print(
        f"\n{TIMERS} timers of {PAYLOAD_BYTES // 1024} KiB due in one second "
        f"({TIMERS * PAYLOAD_BYTES / MIB:.0f} MiB), {BUDGET_ENV}={BUDGET_BYTES / MIB:.0f} MiB: in the table "
        f"after {ingested_s:.1f}s, restarted by {restarted_s:.1f}s; RSS {growth.before / MIB:.0f} MiB before "
        f"the hot second, +{grew / MIB:.0f} MiB at its peak, {rest / MIB:.0f} MiB at rest after it; last "
        f"callback {last_s:.1f}s after due; {sum(fired.values()) - len(fired)} repeats"
    )
    missing = ids - set(fired)
    assert not missing, f"{len(missing)} of {TIMERS} timers never fired"
    assert early == 0, f"{early} fired early"
    assert grew <= BUDGET_BYTES + ALLOWANCE_BYTES, (
        f"the worker grew by {grew / MIB:.0f} MiB firing, over its budget of "
        f"{BUDGET_BYTES / MIB:.0f} MiB + {ALLOWANCE_BYTES / MIB:.0f} MiB"
    )
    assert rest <= peak - RETURNED_BYTES, (
        f"at rest the worker still holds {rest / MIB:.0f} MiB, its peak {peak / MIB:.0f} MiB "
        f"less {(peak - rest) / MIB:.0f}: what the hot second freed was not handed back"
    )


#: A burst of requests: BURST timers of PAYLOAD_BYTES (12 times the budget), due in a day.
BURST = 3000
#: Memory the worker may add while it ingests, besides the budget: the block cache, the
#: partition tables' memtables (filled by the puts; bounded for all tables together, not by
#: payloads), and 32 MiB for the Kafka clients' buffers and the allocators' slack.
INGEST_ALLOWANCE_BYTES = BLOCK_CACHE_BYTES + MEMTABLES_BYTES + 32 * MIB


def test_a_burst_of_large_requests_is_ingested_within_the_budget(stack: Stack) -> None:
    worker = start_with_budget(stack)
    stack.wait_for_metric(ADVANCED_TICKS, lambda v: v > 0, timeout_s=20)  # started up
    growth = Growth(worker.pid)
    started = time.monotonic()
    schedule_large(stack, stack.callback_topic("memory-burst").topic, BURST, time.time() + 86_400)
    stack.wait_for_metric("timers_pending", lambda v: v == BURST, timeout_s=40)
    grew = growth.stop()
    print(
        f"\n{BURST} requests of {PAYLOAD_BYTES // 1024} KiB ({BURST * PAYLOAD_BYTES / MIB:.0f} MiB) in the "
        f"table after {time.monotonic() - started:.1f}s; RSS {growth.before / MIB:.0f} MiB before, "
        f"+{grew / MIB:.0f} MiB at the peak"
    )
    assert grew <= BUDGET_BYTES + INGEST_ALLOWANCE_BYTES, (
        f"the worker grew by {grew / MIB:.0f} MiB ingesting {BURST * PAYLOAD_BYTES / MIB:.0f} MiB of requests"
    )
