"""A due timer's callback record, built before the timer is due where the worker can.

:func:`futures.worker.prepare.prepare` builds a :class:`Callback` once, from the timer's
bytes in the table (compiled: it runs for every fired timer); what is left when the timer
comes due is the ``produce`` call (:mod:`futures.worker.callback_queue`, compiled too).
Precise mode's windows prepare their second's timers while the second before is
sending; in second mode, :mod:`futures.worker.lookahead` prepares the next
second's while the worker waits for its tick.
"""

from __future__ import annotations

from typing import NamedTuple

from ktimers.wire import H_OCCURRENCE, StoredTimer


class Callback(NamedTuple):
    """What the worker sends when a timer fires, and what it records once it is delivered.

    Not the ``StoredTimer`` it was built from: a callback waits in memory with its payload
    once, and the rare paths that need the whole timer (a dead letter, a series' next
    occurrence) read it from the table, which holds it until the callback is settled
    (:func:`stored_timer`).

    Only strings, bytes, numbers and tuples of them, and one object per callback: thousands
    wait in memory for their second, and objects holding other objects (a list of header
    tuples) would make every young collection of Python's garbage collector scan them
    (docs/PERFORMANCE.md#firing-a-timer, *memory, GC*).
    """

    key: bytes  # the timer's table key
    partition: int  # its `timer-request` partition (and table)
    topic: str
    record_key: bytes
    value: bytes
    timer_id: str
    due_ms: int
    source_offset: int
    # The values of its headers (see ``ktimers.wire.lay_out_callback_headers``).
    id_header: bytes
    due_header: bytes
    own_headers: tuple[tuple[str, bytes | None], ...]
    token: bytes
    #: Ordinal of a recurring timer's occurrence (``kt-occurrence``); 0 for a timer that is no series.
    occurrence: int = 0


#: A due timer as a scan of its table read it: (table key, partition, stored bytes).
Item = tuple[bytes, int, bytes]


def stored_timer(callback: Callback, stored: bytes | None) -> StoredTimer:
    """The timer ``callback`` was built from: ``stored`` (its bytes in the table), or, if the
    table no longer holds it (cancelled while its callback was on its way), what the
    callback itself carries of it."""
    if stored is not None:
        return StoredTimer.FromString(stored)
    timer = StoredTimer(source_partition=callback.partition, source_offset=callback.source_offset)
    future = timer.future
    future.callBackTopic, future.callBackKey, future.callBack = (
        callback.topic,
        callback.record_key.decode(errors="replace"),
        callback.value,
    )
    future.id, future.due_ms, future.token = callback.timer_id, callback.due_ms, callback.token.decode()
    for name, value in callback.own_headers:
        if name != H_OCCURRENCE:  # ours, added to the user's
            future.headers.add(key=name, value=value or b"")
    return timer
