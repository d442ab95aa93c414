"""The worker's confluent-kafka producers: callbacks, changelog, events and dead letters.

Faust's own producer sends one record per await, too slow for the engine's writes
(docs/PERFORMANCE.md#the-worker-is-one-python-process-on-one-core): everything the
engine writes goes through librdkafka in bulk instead, and each step awaits the
delivery reports of its own records at once.

Three producers. The main one reports every record it writes for the service's own
topics: a progress record's report says its changelog offset; events and dead letters.
The *quiet* one takes the changelog's bulk (a put per timer accepted, a tombstone per
timer swept): all a write needs of those is that every one was delivered, so it reports
only failures (``delivery.report.only.error``, which confluent-kafka filters in C), and a
write is delivered once the quiet producer holds nothing more, and a record costs the
producing thread less (docs/PERFORMANCE.md#accepting-a-timer, *Waiting for the broker*).
The engine's changelog writes run one at a
time under its lock, so what the quiet producer holds is the write being awaited. The
*callbacks* one writes the callbacks, whose reports say whether their timers fired.

The two that write the service's own topics never give a record up
(``message.timeout.ms`` 0): a write that waits out a broker outage goes on when the
brokers answer, where one that failed would stop the worker, and a restart cannot bring
the brokers back. The callbacks give up after :data:`MESSAGE_TIMEOUT_MS`, so one callback
topic that cannot be written stalls no firing: its timers stay in the table for the next.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message

from ktimers.config import KafkaConfig
from ktimers.errors import DeliveryError
from ktimers.producer import ANY_PARTITION, ProducerLike, RecordHeaders

#: How long librdkafka retries one callback before reporting it failed (ms). A wait for
#: callbacks never lasts longer than this, so one unwritable topic cannot stall firing.
MESSAGE_TIMEOUT_MS = 30_000
#: librdkafka's "retry until delivered", for the records of the service's own topics.
NEVER_GIVE_UP_MS = 0


class Deliveries:
    """Delivery reports of one group of records.

    Failures land in :attr:`errors`, by an index given at produce time (a record refused
    before it was queued), or in :attr:`failed` with the record the report names. With
    ``offsets=True`` it also keeps the highest offset written per partition (the
    changelog's, for the table's persisted offset). A success costs one call that
    returns at once, to one bound method: this runs for every callback the worker writes.
    Quiet records (:meth:`KafkaWriter.produce_many`) report only their failures, through
    :meth:`on_failure`.
    """

    __slots__ = ("errors", "failed", "offsets", "on_delivery", "pending", "quiet")

    def __init__(self, *, offsets: bool = False) -> None:
        self.errors: dict[int, KafkaError] = {}
        #: Failures reported by librdkafka, with the message each names (None if it names none).
        self.failed: list[tuple[KafkaError, Message | None]] = []
        self.offsets: dict[int, int] = {}  # partition -> highest offset
        #: Records produced into this group whose report has not come yet.
        self.pending = 0
        #: The delivery callback of a record produced without an index.
        self.on_delivery: Callable[[KafkaError | None, Message | None], None] = (
            self._report_offset if offsets else self._report
        )
        #: Records were produced into this group through the quiet producer
        #: (:meth:`KafkaWriter.produce_many`): not counted in :attr:`pending`, delivered once
        #: that producer holds nothing more.
        self.quiet = False

    def report(self, index: int, err: KafkaError | None, msg: Message | None) -> None:
        self.pending -= 1
        if err is not None or msg is None:
            self.errors[index] = err or KafkaError(KafkaError._FAIL)

    def _report(self, err: KafkaError | None, msg: Message | None) -> None:
        self.pending -= 1
        if err is not None or msg is None:
            self.failed.append((err or KafkaError(KafkaError._FAIL), msg))

    def on_failure(self, err: KafkaError | None, msg: Message | None) -> None:
        """The delivery callback of a quiet record: called when it failed (and, on a producer
        that reports every record, when it was delivered: ignored)."""
        if err is not None:
            self.failed.append((err, msg))

    def _report_offset(self, err: KafkaError | None, msg: Message | None) -> None:
        self.pending -= 1
        if err is not None or msg is None:
            self.failed.append((err or KafkaError(KafkaError._FAIL), msg))
            return
        partition, offset = msg.partition(), msg.offset()
        if partition is not None and offset is not None and offset > self.offsets.get(partition, -1):
            self.offsets[partition] = offset

    def raise_first(self, what: str) -> None:
        errors = [*self.errors.values(), *(err for err, _ in self.failed)]
        if errors:
            raise DeliveryError(f"{len(errors)} {what} record(s) not delivered, first: {errors[0].str()}")


#: Errors about the producer's own id and epoch, not about the record: after a broker outage
#: the embedded broker answered PRODUCER_FENCED to every send of a producer whose records had
#: timed out, for good. The record is fine; the producer is replaced (:meth:`KafkaWriter.renew_callbacks`).
PRODUCER_STATE_ERRORS = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
    }
)


def refuses_producer(err: KafkaError) -> bool:
    """True when ``err`` says the producer can send nothing more (fatal, or its id refused)."""
    return err.fatal() or err.code() in PRODUCER_STATE_ERRORS


def is_permanent(err: KafkaError) -> bool:
    """True when retrying cannot help (unknown topic, not authorised, too large...).

    Timeouts and transport errors are transient: the records are kept and tried again; so are
    a refused producer's (:func:`refuses_producer`), sent again by a new one.
    """
    if err.retriable() or refuses_producer(err):
        return False
    return err.code() not in (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._PURGE_QUEUE,  # a replaced producer's: sent again by the new one
        KafkaError._PURGE_INFLIGHT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    )


#: How often :meth:`KafkaWriter.delivered` serves delivery reports (s): soon for the first
#: _POLL_SOON_FOR_S (a broker acknowledges within milliseconds), then less often.
_POLL_SOON_S = 0.001
_POLL_SOON_FOR_S = 0.1
_POLL_LATER_S = 0.01

#: How long :meth:`KafkaWriter.delivered` blocks to send the awaited records at once (s).
SEND_NOW_S = 0.001

#: How long :meth:`KafkaWriter.close` flushes at shutdown (s): within the 60 s Kubernetes grants
#: a stopping worker, with room for the rest of its shutdown.
CLOSE_TIMEOUT_S = 30.0

#: librdkafka's default ``message.max.bytes``.
DEFAULT_MAX_RECORD_BYTES = 1_000_000


#: How long librdkafka holds a record for more to batch with it (ms), unless a wait for delivery
#: reports sends it at once (:meth:`KafkaWriter.delivered`): in second mode, what is produced is
#: soon waited for.
LINGER_MS = 5
#: The same in precise mode, whose windows produce each callback on its millisecond and wait for
#: none of them as it goes: the linger alone sends them. Against the embedded broker fewer, larger
#: requests come through with a far shorter tail (``bench.direct``: docs/PERFORMANCE.md#lateness).
PRECISE_LINGER_MS = 10


def producer_config(
    kafka: KafkaConfig,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    *,
    quiet: bool = False,
    callbacks: bool = False,
    linger_ms: int = LINGER_MS,
) -> dict[str, str | int | float | bool]:
    """``max_record_bytes``: the largest record it may write (``WorkerConfig.max_record_bytes``);
    ``quiet``: the quiet producer's (see the module docstring), which reports only failures;
    ``callbacks``: the callbacks producer's, which gives a record up after :data:`MESSAGE_TIMEOUT_MS`;
    ``linger_ms``: :data:`LINGER_MS`, or :data:`PRECISE_LINGER_MS` in precise mode."""
    quiet_only: dict[str, str | int | float | bool] = (
        {"delivery.report.only.error": True, "client.id": "kafka-timers-changelog"} if quiet else {}
    )
    return {
        **quiet_only,
        **kafka.librdkafka(),
        "enable.idempotence": True,
        "acks": "all",
        # The worker writes only to topics it has seen listed (futures/worker/destinations.py);
        # one deleted since must not be created again by a callback on a cluster that allows it.
        "allow.auto.create.topics": False,
        "linger.ms": linger_ms,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        # Bounds what a hot second can buffer (librdkafka's default is 1 GB);
        # produce() then waits for room (see KafkaWriter.produce).
        "queue.buffering.max.kbytes": 128 * 1024,
        "message.timeout.ms": MESSAGE_TIMEOUT_MS if callbacks else NEVER_GIVE_UP_MS,
        "message.max.bytes": max_record_bytes,
    }


class KafkaWriter:
    """Produce many records, then await their delivery reports together (:meth:`delivered`)."""

    def __init__(
        self,
        producer: ProducerLike,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        *,
        quiet: ProducerLike | None = None,
        callbacks: ProducerLike | None = None,
        new_callbacks: Callable[[], ProducerLike] | None = None,
    ) -> None:
        """``quiet``: the producer of :meth:`produce_many` (``producer`` itself if None: a
        quiet record is then delivered once ``producer`` holds nothing more); ``callbacks``:
        the producer of :attr:`queue` and :meth:`produce_callback` (``producer`` if None);
        ``new_callbacks`` makes another, for :meth:`renew_callbacks`."""
        self._new_callbacks = new_callbacks
        #: Replaced callbacks producers whose purged records' reports have not all been served.
        self._retired: list[ProducerLike] = []
        self._producer = producer
        self._quiet = producer if quiet is None else quiet
        self._callbacks = producer if callbacks is None else callbacks
        #: Each producer once, for the calls that serve or flush them all.
        self._all = tuple({id(p): p for p in (producer, self._quiet, self._callbacks)}.values())
        #: The producer's own ``produce``, for loops that queue many records: one call into
        #: librdkafka and nothing else. On ``BufferError`` or ``KafkaException`` they fall back to
        #: :meth:`produce`, which waits for room or reports the refusal. Called with positional
        #: arguments (:class:`~ktimers.producer.ProducerLike`): confluent-kafka parses keywords
        #: at every call (docs/PERFORMANCE.md#firing-a-timer).
        self.queue = self._callbacks.produce
        #: The producer's ``message.max.bytes``: dead letters are cut to fit it.
        self.max_record_bytes = max_record_bytes

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        headers: Sequence[tuple[str, str | bytes | None]] | None = None,
        partition: int = ANY_PARTITION,
        deliveries: Deliveries | None = None,
        index: int | None = None,
    ) -> None:
        """Queue one record; with ``deliveries``, its report lands there (under ``index``, if given).

        ``headers`` must be a list (librdkafka takes no other sequence); ``partition``
        :data:`ANY_PARTITION` lets the producer's partitioner choose.
        Events, dead letters and progress records: kept until delivered.
        """
        self._produce_into(self._producer, topic, key, value, headers, partition, deliveries, index)

    def produce_callback(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        headers: Sequence[tuple[str, str | bytes | None]] | None = None,
        partition: int = ANY_PARTITION,
        deliveries: Deliveries | None = None,
        index: int | None = None,
    ) -> None:
        """:meth:`produce` for a callback the compiled queue's own call into librdkafka
        (:attr:`queue`) could not queue: through the callbacks producer."""
        self._produce_into(self._callbacks, topic, key, value, headers, partition, deliveries, index)

    @staticmethod
    def _produce_into(
        producer: ProducerLike,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, str | bytes | None]] | None,
        partition: int,
        deliveries: Deliveries | None,
        index: int | None,
    ) -> None:
        if deliveries is None:
            report = None
        else:
            deliveries.pending += 1
            report = deliveries.on_delivery if index is None else functools.partial(deliveries.report, index)
        _queue_into(producer, topic, key, value, partition, report, headers)

    def produce_many(
        self,
        topic: str,
        partition: int,
        records: Iterable[tuple[bytes, bytes | None]],
        deliveries: Deliveries,
        headers: RecordHeaders | None = None,
    ) -> None:
        """Queue ``records`` (key, value) to one partition through the quiet producer, each with
        ``headers``; their failures land in ``deliveries``, which :meth:`delivered` awaits until
        that producer holds nothing more.

        The changelog's path: a put per accepted timer, a tombstone per swept one.
        """
        quiet = self._quiet
        queue, report = quiet.produce, deliveries.on_failure
        deliveries.quiet = True
        for key, value in records:
            try:
                queue(topic, value, key, partition, report, None, 0, headers)
            except (BufferError, KafkaException):
                _queue_into(quiet, topic, key, value, partition, report, headers)

    async def delivered(self, *groups: Deliveries) -> None:
        """Wait until every record of ``groups`` has its delivery report.

        The records do not linger: librdkafka waits ``linger.ms`` for more records before it
        sends a batch, and skips that wait only while a flush blocks (a ``flush(0)`` returns
        before its broker thread looks, and delayed the reports by a millisecond more than no
        flush); so this blocks for :data:`SEND_NOW_S` first. What is awaited is sent now: the
        linger batches what nobody waits for yet (precise mode's windows, a firing's next
        piece while this one's reports come in).

        A group with quiet records (:meth:`produce_many`) is delivered once the quiet producer
        holds nothing more: neither records nor failures to report.

        Unlike a flush, it does not wait for records produced meanwhile by others
        (precise mode's windows send without the engine lock): under a steady stream of
        records a flush may not see the queue empty for a long time.

        The reports are served here, on the event loop, between short sleeps: their callbacks
        are Python either way, and served on a thread (the way librdkafka's blocking calls
        would) every batch of them cost a handover of the GIL with the loop.
        """
        quiet = self._quiet
        waits_quiet = any(group.quiet for group in groups)
        waits_reports = any(group.pending for group in groups)
        if not waits_quiet and not waits_reports:
            return
        flushed: list[ProducerLike] = []
        if waits_reports:
            flushed += (
                [self._producer] if self._callbacks is self._producer else [self._producer, self._callbacks]
            )
        if waits_quiet and all(quiet is not p for p in flushed):
            flushed.append(quiet)
        for producer in flushed:
            producer.flush(SEND_NOW_S)
        waited = 0.0
        while True:
            for producer in self._all:
                producer.poll(0)
            if self._retired:
                self._serve_retired()
            if not any(group.pending for group in groups) and not (waits_quiet and len(quiet)):
                return
            # A callback is reported within MESSAGE_TIMEOUT_MS, a record of the service's own
            # topics once the brokers took it; a long wait (an outage) checks less often.
            pause = _POLL_SOON_S if waited < _POLL_SOON_FOR_S else _POLL_LATER_S
            await asyncio.sleep(pause)
            waited += pause

    def renew_callbacks(self) -> bool:
        """Replace the callbacks producer by a new one (its :attr:`queue` changes): the brokers
        refuse the current one. What it holds is purged: those callbacks' timers are still in
        the table, sent again by the next firing. False when there is no way to make one."""
        if self._new_callbacks is None or self._callbacks is self._producer:
            return False
        old, self._callbacks = self._callbacks, self._new_callbacks()
        self._all = tuple({id(p): p for p in (self._producer, self._quiet, self._callbacks)}.values())
        self.queue = self._callbacks.produce
        purge = getattr(old, "purge", None)
        if callable(purge):
            purge()
        # Served until it holds nothing: their reports (purged, transient) reach the waits for them.
        self._retired.append(old)
        return True

    def _serve_retired(self) -> None:
        for old in self._retired:
            old.poll(0)
        self._retired = [old for old in self._retired if len(old)]

    def serve(self) -> None:
        """Serve the delivery reports that came, without waiting (the producer of :meth:`produce`)."""
        self._producer.poll(0)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> int:
        """Flush every producer for at most ``timeout_s`` seconds in all; how many records are
        left undelivered (the brokers are away: what they hold is written again after a restart)."""
        deadline = time.monotonic() + timeout_s
        left = 0
        for producer in (*self._all, *self._retired):
            left += producer.flush(max(0.0, deadline - time.monotonic()))
        return left


def _queue_into(
    producer: ProducerLike,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    partition: int,
    report: Callable[[KafkaError | None, Message | None], None] | None,
    headers: Sequence[tuple[str, str | bytes | None]] | None = None,
) -> None:
    """Queue one record into ``producer``, waiting for room while its local queue is full; a
    record refused before it was queued is a failure reported to ``report`` (raised without one)."""
    while True:
        try:
            producer.produce(topic, value, key, partition, report, None, 0, cast(RecordHeaders, headers))
            return
        except BufferError:
            # The local queue is full: serve delivery reports to make room.
            producer.poll(0.05)
        except KafkaException as exc:
            # Refused before it was queued (e.g. larger than message.max.bytes):
            # a delivery failure of this record, not of the whole batch.
            if report is None:
                raise
            report(exc.args[0], None)
            return
