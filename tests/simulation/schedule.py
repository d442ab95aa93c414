"""The steps of a run, drawn from a seed; each step carries every choice it makes.

A schedule is a plain list of steps: the world (:mod:`tests.simulation.world`) runs it the same
way every time, and a shrink (:mod:`tests.simulation.shrink`) drops steps from it. A step that no
longer makes sense once others are dropped (a crash of a worker already dead) does nothing.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from tests.simulation.faults import Fault

PARTITIONS = 4
WORKERS = 3
OSCILLATORS = 2


class Txn(Enum):
    PLAIN = "plain"  # an idempotent producer, no transaction
    COMMIT = "commit"
    ABORT = "abort"


@dataclass(frozen=True)
class Schedule:
    """A client writes ``count`` timers (ids ``timer`` …), version ``version``, due ``due_in_ms`` from now."""

    timer: int
    version: int
    due_in_ms: int
    count: int = 1
    txn: Txn = Txn.PLAIN
    malformed: bool = False  # a valid Future with an unknown group field appended
    spread_ms: int = 0  # timer n of the ``count`` is due ``n * spread_ms`` after the first
    stride: int = 1  # timer n's id is ``timer + n * stride`` (PARTITIONS: all in one partition)


@dataclass(frozen=True)
class Cancel:
    timer: int
    version: int  # the write's own number: versions and cancels share one sequence
    txn: Txn = Txn.PLAIN


@dataclass(frozen=True)
class Advance:
    """Time passes by ``ms``, in slices of 1 .. ``quantum_ms``; ``seed`` draws slices and latencies."""

    ms: int
    quantum_ms: int
    seed: int


@dataclass(frozen=True)
class TickFault:
    kind: Fault  # DUPLICATE_TICK, REORDERED_TICK or BOGUS_TICK
    partition: int
    back_s: int = 0  # how far back a reordered tick's second lies


@dataclass(frozen=True)
class PauseOscillator:
    oscillator: int
    seconds: int


@dataclass(frozen=True)
class Crash:
    """``worker`` dies at its ``after_writes``-th write from now (0: at once)."""

    worker: int
    after_writes: int
    delivered_share: float


@dataclass(frozen=True)
class Restart:
    worker: int
    empty_dir: bool


@dataclass(frozen=True)
class Rebalance:
    owners: tuple[int, ...]  # per partition, the index of the worker it goes to (among the live)
    #: Faust's eager protocol: every worker revokes every partition, then the assignment hands
    #: back those it keeps (their tables open). Else only the partitions that move are revoked.
    eager: bool = False


@dataclass(frozen=True)
class Compact:
    partition: int
    tail: int  # records past the cut, left uncleaned (the active segment)


@dataclass(frozen=True)
class Slow:
    worker: int
    latency_ms: int
    for_ms: int


@dataclass(frozen=True)
class Pause:
    """``worker`` stops for ``ms`` (a stalled process); past the session timeout the group gives its
    partitions to others, and once it resumes it runs ``zombie_ms`` before it hears of that."""

    worker: int
    ms: int
    zombie_ms: int


@dataclass(frozen=True)
class Verify:
    """Compact every changelog partition, and rebuild each quiet owner's table from it into an empty dir."""


Step = (
    Schedule
    | Cancel
    | Advance
    | TickFault
    | PauseOscillator
    | Crash
    | Restart
    | Rebalance
    | Compact
    | Slow
    | Pause
    | Verify
)


def generate(seed: int, steps: int, faults: Iterable[Fault], settle_s: float) -> list[Step]:
    """``steps`` steps drawn from ``seed``, using only the fault kinds in ``faults``."""
    rng = random.Random(seed)
    enabled = frozenset(faults)
    out: list[Step] = []
    next_timer, next_version = 0, 0
    written: list[int] = []

    def txn() -> Txn:
        kinds = [Txn.PLAIN]
        if Fault.COMMITTED_TXN in enabled:
            kinds.append(Txn.COMMIT)
        if Fault.ABORTED_TXN in enabled:
            kinds.append(Txn.ABORT)
        return rng.choice(kinds)

    choices: list[tuple[str, float]] = [
        ("schedule", 30),
        ("replace", 8),
        ("cancel", 8),
        ("advance", 30),
        ("verify", 2),
        ("burst", 1),
    ]
    optional = {
        "crash": (Fault.CRASH, 3),
        "restart": (Fault.CRASH, 4),
        "rebalance": (Fault.REBALANCE, 5),
        "compact": (Fault.COMPACTION, 4),
        "duplicate": (Fault.DUPLICATE_TICK, 2),
        "reorder": (Fault.REORDERED_TICK, 2),
        "pause": (Fault.LATE_TICK, 1),
        "bogus": (Fault.BOGUS_TICK, 2),
        "slow": (Fault.SLOW_BROKER, 2),
        "pause_worker": (Fault.PAUSED_OWNER, 2),
    }
    choices += [(name, weight) for name, (fault, weight) in optional.items() if fault in enabled]
    names, weights = [c[0] for c in choices], [c[1] for c in choices]
    while len(out) < steps:
        kind = rng.choices(names, weights)[0]
        if kind == "schedule" or (kind in ("replace", "cancel") and not written):
            next_version += 1
            malformed = Fault.MALFORMED_REQUEST in enabled and rng.random() < 0.05
            out.append(Schedule(next_timer, next_version, rng.randint(-2_000, 15_000), 1, txn(), malformed))
            written.append(next_timer)
            next_timer += 1
        elif kind == "burst":
            # Enough timers in one second that one f record lists more than a sweep slice.
            # A hot second in one partition: its f record lists more than a sweep slice, and with
            # sweep_handback's slow disk its sweep lasts past the next tick.
            next_version += 1
            count = rng.randint(260, 4_000 if Fault.SWEEP_HANDBACK in enabled else 1_000)
            first = (next_timer // PARTITIONS + 1) * PARTITIONS + rng.randrange(PARTITIONS)
            out.append(
                Schedule(first, next_version, rng.randint(1_000, 8_000), count, Txn.PLAIN, stride=PARTITIONS)
            )
            next_timer = first + count * PARTITIONS
        elif kind == "replace":
            next_version += 1
            out.append(Schedule(rng.choice(written), next_version, rng.randint(-1_000, 15_000), 1, txn()))
        elif kind == "cancel":
            next_version += 1
            out.append(Cancel(rng.choice(written), next_version, txn()))
        elif kind == "advance":
            out.append(
                Advance(
                    rng.choice([50, 200, 700, 1_500, 4_000]), rng.choice([5, 20, 60]), rng.getrandbits(32)
                )
            )
        elif kind == "verify":
            out.append(Verify())
        elif kind == "crash":
            share = rng.choice([0.0, 0.5, 1.0])
            out.append(Crash(rng.randrange(WORKERS), rng.choice([0, 1, 2, 3, 5, 8, 13, 30]), share))
        elif kind == "restart":
            empty = _restart_empty(rng, enabled)
            if empty is not None:
                out.append(Restart(rng.randrange(WORKERS), empty))
        elif kind == "rebalance":
            owners = tuple(rng.randrange(WORKERS) for _ in range(PARTITIONS))
            out.append(Rebalance(owners, eager=rng.random() < 0.5))
        elif kind == "compact":
            out.append(Compact(rng.randrange(PARTITIONS), rng.choice([0, 1, 3, 10])))
        elif kind in ("duplicate", "reorder", "bogus"):
            fault = {
                "duplicate": Fault.DUPLICATE_TICK,
                "reorder": Fault.REORDERED_TICK,
                "bogus": Fault.BOGUS_TICK,
            }[kind]
            partition = rng.randrange(PARTITIONS)
            out.append(TickFault(fault, partition, rng.randint(1, 30)))
            if fault is Fault.BOGUS_TICK:
                # A tick too far ahead waits out the join's bound (60 s), then fires up to the
                # tolerance: timers due then, one every 10 ms, for the partition it came to.
                next_version += 1
                first = (next_timer // PARTITIONS + 1) * PARTITIONS + partition
                out.append(
                    Schedule(first, next_version, 59_000, 300, Txn.PLAIN, spread_ms=10, stride=PARTITIONS)
                )
                next_timer = first + 300 * PARTITIONS
        elif kind == "pause":
            out.append(PauseOscillator(rng.randrange(OSCILLATORS), rng.randint(1, 8)))
        elif kind == "pause_worker":
            out.append(Pause(rng.randrange(WORKERS), rng.randint(1_000, 12_000), rng.randint(0, 2_000)))
        elif kind == "slow":
            # Within the time a revocation waits for the step under way, or (late_zombie_writes)
            # up to three times it: the step's writes land after the new owner restored.
            cap_ms = int(settle_s * 1000 / 8)
            if Fault.LATE_ZOMBIE_WRITES in enabled and rng.random() < 0.5:
                cap_ms = int(settle_s * 3000)
            out.append(
                Slow(rng.randrange(WORKERS), rng.randint(cap_ms // 4, cap_ms), rng.randint(500, 20_000))
            )
    return out


def _restart_empty(rng: random.Random, enabled: frozenset[Fault]) -> bool | None:
    kinds = [k for k, f in ((True, Fault.RESTART_EMPTY), (False, Fault.RESTART_OLD)) if f in enabled]
    return rng.choice(kinds) if kinds else None
