"""The invariants, checked against what the world's log holds once a run has healed.

Each callback record on the callback topic says which timer version it is (its payload), its due
time, which worker produced it and what that worker's clock read then (the simulated producer
keeps both). The checker compares them with the model (:mod:`tests.simulation.model`) and the
world's history of crashes and handovers. Checks on the tables themselves (pending count, a
restore equal to the live table, a worker that stopped) are made by the world as it runs
(:meth:`World.verify`), into the same list of violations.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ktimers.wire import header_value
from tests.simulation.kafka import LogRecord
from tests.simulation.world import CALLBACKS, Violation, World


@dataclass(frozen=True)
class Delivery:
    timer_id: str
    version: int
    marked_id: str  # the kt-id header
    due_ms: int  # the kt-due-ms header
    sender: str
    sender_clock_ms: int
    sent_ms: int  # true time the worker produced it


def deliveries(world: World) -> list[Delivery]:
    return [_delivery(r) for r in world.kafka.partition(CALLBACKS, 0).records if r.marker is None]


def _delivery(record: LogRecord) -> Delivery:
    timer_id, _, version = (record.value or b"").decode().partition("|")
    due = header_value(list(record.headers), "kt-due-ms")
    marked = header_value(list(record.headers), "kt-id")
    return Delivery(
        timer_id,
        int(version or -1),
        (marked or b"").decode(),
        int(due or -1),
        record.writer,
        record.writer_clock_ms,
        record.timestamp_ms,
    )


def check(world: World) -> list[Violation]:
    """Every violation of the run (the world's own first)."""
    found = list(world.violations)
    sent = deliveries(world)
    found += never_early(world, sent)
    found += marked(sent)
    found += latest_wins(world, sent)
    found += duplicates_licensed(world, sent)
    found += nothing_lost(world, sent)
    found += pending_drained(world)
    return found


def never_early(world: World, sent: list[Delivery]) -> list[Violation]:
    """No callback before its due time by its sender's clock, beyond how far the honest
    oscillators' clocks lead that clock (a tick is trusted up to the worker's clock plus the
    tolerance: that lead is allowed, never more); and never beyond the tolerance at all."""
    tolerance = world.config.clock_tolerance_ms
    skews = {w.name: w.skew_ms for w in world.workers}
    lead = max(o.skew_ms for o in world.oscillators)
    found = []
    for d in sent:
        allowed = max(0, lead - skews.get(d.sender, 0))
        early = d.due_ms - d.sender_clock_ms
        if early > tolerance:
            found.append(
                Violation(
                    "early_beyond_tolerance", f"{d.timer_id} v{d.version} {early} ms early on {d.sender}"
                )
            )
        elif early > allowed:
            found.append(
                Violation(
                    "early",
                    f"{d.timer_id} v{d.version} {early} ms early on {d.sender} (oscillators allow {allowed})",
                )
            )
    return found


def marked(sent: list[Delivery]) -> list[Violation]:
    """Every callback carries its timer's id (kt-id), so a receiver can drop repeats."""
    return [
        Violation("unmarked", f"{d.timer_id} carries kt-id {d.marked_id!r}")
        for d in sent
        if d.marked_id != d.timer_id
    ]


def latest_wins(world: World, sent: list[Delivery]) -> list[Violation]:
    """A callback is of a committed version, and no cancel or newer version written before its due
    time and before it was sent had come (the join: a request written before a tick is applied first)."""
    found = []
    for d in sent:
        write = world.model.write_of(d.timer_id, d.version)
        if write is None:
            found.append(Violation("unknown_version", f"{d.timer_id} v{d.version} was never written"))
            continue
        if write.aborted:
            found.append(
                Violation("aborted_applied", f"{d.timer_id} v{d.version} fired from an aborted transaction")
            )
            continue
        if write.due_ms != d.due_ms:
            found.append(
                Violation("wrong_due", f"{d.timer_id} v{d.version} due {write.due_ms}, sent as {d.due_ms}")
            )
        for later in world.model.later(write):
            if later.written_ms < d.due_ms and later.written_ms < d.sent_ms:
                what = "a cancel" if later.due_ms is None else f"v{later.version}"
                found.append(
                    Violation(
                        "superseded_fired",
                        f"{d.timer_id} v{d.version} (due {d.due_ms}) sent at {d.sent_ms} by {d.sender} "
                        f"after {what} written at {later.written_ms}",
                    )
                )
                break
    return found


def duplicates_licensed(world: World, sent: list[Delivery]) -> list[Violation]:
    """A version sent more than once only if a worker crashed, or a revocation did not settle,
    between its first and its last sending (at least once: those repeat what was in flight), or
    an owner of its partition stalled past its session then, or one of the copies came from an
    owner the group left out while it stalled, before it heard."""
    times: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
    for d in sent:
        times[(d.timer_id, d.version)].append(d)
    found = []
    for (timer_id, version), copies in times.items():
        if len(copies) < 2:
            continue
        first, last = min(c.sent_ms for c in copies), max(c.sent_ms for c in copies)
        partition = world.model.write_of(timer_id, version)
        p = partition.partition if partition is not None else -1
        crashed = any(first <= t <= last for t in world.history.crashes)
        unsettled = any(first <= t <= last and q == p for t, q in world.history.unsettled)
        # An owner stalled past its session sends, once back, until it hears it was left out; and
        # to the group a stall is a crash: what it had in flight lands late, fenced, and its
        # successor sends again what that would have settled.
        paused = any(
            (c.sender == name and stalled <= c.sent_ms <= heard or first <= stalled <= last) and q == p
            for c in copies
            for name, stalled, heard, q in world.history.paused
        )
        if not crashed and not unsettled and not paused:
            senders = ", ".join(f"{c.sender}@{c.sent_ms}" for c in copies)
            found.append(
                Violation(
                    "duplicate", f"{timer_id} v{version} sent {len(copies)} times ({senders}) with no crash"
                )
            )
    return found


def nothing_lost(world: World, sent: list[Delivery]) -> list[Violation]:
    """Each timer whose latest committed write is a schedule was delivered once the world healed."""
    delivered = {(d.timer_id, d.version) for d in sent}
    return [
        Violation("lost", f"{w.timer_id} v{w.version} (due {w.due_ms}, p{w.partition}) never fired")
        for w in world.model.must_fire()
        if (w.timer_id, w.version) not in delivered
    ]


def pending_drained(world: World) -> list[Violation]:
    """Once every timer came due and fired, no table holds a timer or counts one."""
    found = []
    for partition, owner in world.final_tables.items():
        count, pending = owner
        if count or pending:
            found.append(
                Violation("pending_left", f"p{partition}: {count} timers left, pending count {pending}")
            )
    return found
