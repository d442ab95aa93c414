"""Recurring timers in the worker: the next occurrence armed as one fires (an invalid
recurrence is refused by the request parser, ``ParseContext.accept``: ``invalid-recurrence``).

A recurring timer (a ``Future`` with a ``Recurrence``, :mod:`ktimers.recurrence`) is one
stored timer at a time, its current occurrence. When that occurrence's callback is
delivered (or dead-lettered), :func:`arm_next` adds the next occurrence's put right before
the current one's tombstone, in the same :class:`~futures.worker.changelog.Changes`: one
changelog write arms the one and removes the other, so a crash either repeats the
occurrence (the usual at-least-once duplicate, same ordinal, which then arms the same next
occurrence again: same table key) or finds the next one armed — never neither, never two.
The next occurrence keeps the id (a cancel or a new version by id ends or replaces the
series) and the original request's coordinates; its table key follows its due time.

Each arming emits a SCHEDULED event for the next occurrence (its due time, the original
request's offset, ``reason`` ``occurrence <ordinal>``). A series whose last occurrence fired
(``until_ms``, ``max_count``) is only tombstoned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from futures.worker.callbacks import Callback
from futures.worker.changelog import Changes
from futures.worker.context import EngineContext
from futures.worker.table import PartitionTimers, table_key
from ktimers.recurrence import next_occurrence
from ktimers.wire import StoredTimer, TimerEvent

#: A next occurrence for a precise window, once written: (partition, due ms, table key, StoredTimer bytes).
Offer = tuple[int, int, bytes, bytes]


def is_recurring(table: PartitionTimers, due_ms: int, timer_id: str) -> bool:
    """Whether the pending timer ``timer_id`` due at ``due_ms`` is a series (a rare path: it reads it)."""
    stored = table.get(due_ms, timer_id)
    return stored is not None and StoredTimer.FromString(stored).future.HasField("recurrence")


def arm_next(
    ctx: EngineContext, fired: Iterable[tuple[Callback, int]], changes: Mapping[int, Changes]
) -> list[Offer]:
    """Stage the next occurrence of each recurring timer in ``fired``, before its tombstone.

    ``fired``: the timers whose tombstones are staged in ``changes`` (by partition), each
    with its floor (epoch ms): occurrences due at or before it are skipped — the watermark the
    firing moved to in second mode, the time it was sent in precise mode. Returns what
    precise mode's windows may take once the write is durable.
    """
    offers: list[Offer] = []
    for callback, floor_ms in fired:
        if not callback.occurrence:
            continue
        table = ctx.tables(callback.partition)
        stored = table.get_raw(callback.key)
        if stored is None:
            continue  # cancelled or replaced while its callback was on its way: the series ends here
        timer = StoredTimer.FromString(stored)
        following = next_occurrence(timer.future, floor_ms)
        if following is None:
            continue  # the series is over: its last occurrence is only tombstoned
        timer.future.CopyFrom(following)
        value = timer.SerializeToString()
        due_ms = following.due_ms
        key = table_key(due_ms, following.id)
        part = changes[callback.partition]
        # Before the tombstone: a write cut short between the two leaves the series armed, and
        # the tombstone leaves the id's index entry to the put (PartitionTimers.apply).
        part.records.append((key, value))
        table.note_put_again(following.id)  # the sweep must not take the entry this put makes
        part.pending_delta += 1
        offers.append((callback.partition, due_ms, key, value))
        ctx.dispatch.event(
            following.id,
            TimerEvent.SCHEDULED,
            callback.partition,
            due_ms=due_ms,
            source_offset=timer.source_offset,
            reason=f"occurrence {following.recurrence.ordinal}",
            callback_topic=following.callBackTopic,
        )
    return offers
