"""Faust's Kafka transport, with the changes the timer worker needs.

1. **Resume from the table, not from Faust's committed offsets.** Faust acks
   (and so commits) records it skips without processing: those fetched while
   flow control is suspended, as it is during a rebalance and at shutdown. For
   most apps that is a re-delivery on the next owner; for us a committed but
   unapplied timer request is a lost timer. The timer table already records,
   in the changelog, the last request offset it applied (``m:progress``), so
   after recovery the consumer seeks every ingress partition to just past it,
   on the consumer's thread, where aiokafka's fetcher lives.
   Committed offsets remain a hint for monitoring and for partitions that have
   no progress yet.
2. **Fetch requests stamped, and a short fetch wait.** The join's frontier
   (:meth:`TimerConsumer.frontier_ms`) is the time a fetch request was sent, which
   is before the broker answered it (:func:`faust_adapter.stamp_fetch_requests`):
   the time aiokafka processed the response is later, and a request written in
   between would lose to a tick. So a tick waits for a request sent after its
   second to be answered, and a broker holds a fetch with no new data only
   briefly: Faust hardcodes ``fetch_max_wait_ms=1500``, here 100 ms (Kafka answers
   sooner as soon as data arrives) and 10 ms on the embedded broker (Tansu waits
   out the full time). Each response wakes the engine, so a waiting tick fires as
   soon as its frontier passes.
3. **Fetched requests and ticks go to the engine whole.** Faust hands a stream
   one event at a time, too slow for a timer's path
   (docs/PERFORMANCE.md#the-worker-is-one-python-process-on-one-core). Request records
   do not take that path: fetched batches go to a :class:`RequestBacklog`, and
   each call of ``getmany`` applies one engine step of it
   (``TIMERS_INGEST_BATCH_SIZE`` records at most) through ``TimerEngine.ingest``;
   their offsets are acked in Faust's books once the engine made them durable, so
   Faust's periodic commit goes on as for any stream. Ticks are handed to the
   engine as they are fetched (``TimerEngine.note_ticks``), whose firing task runs
   beside ingest; a tick then waits for the requests of its partition written
   before it (:mod:`futures.worker.join`), which this consumer measures
   (:meth:`TimerConsumer.frontier_ms`). With a few steps in hand the consumer stops
   fetching the partitions they are of, which bounds the backlog and keeps every
   other partition's frontier known. Faust keeps group membership, co-partitioned
   assignment and changelog recovery.
4. **A restart removes its dead incarnation from the group** (dynamic membership
   only): the consumer thread records its member id in the data dir whenever it
   joins and, once started, sends a LeaveGroup for the recorded one before the
   first join. See :mod:`futures.worker.membership`.

5. **Transactional producers.** The consumer reads ``read_committed``: records of aborted
   transactions never reach the engine. The offsets the consumer reads past without a
   record — each transaction's marker, an aborted transaction's records — are reported by
   aiokafka's readers (:mod:`futures.worker.fetch`) and kept in :class:`PassedOffsets`:
   the engine reads no such hole back, and they are acked with the requests around them,
   so that Faust's committed offset reaches the end of the partition.

6. **A fetch that outlives a rebalance hands nothing over.** aiokafka holds a fetch
   asked for before a rebalance until the new assignment, then answers it with
   records of that assignment — of any partition, once the rebalance has emptied
   the set of partitions the fetch was given (Faust's live set of active ones).
   Flow is still stopped then, so the consumer drops them, as Faust's does, while
   aiokafka's position has moved past them. A stream partition is sought again
   when flow resumes; a changelog partition is not: table recovery, which sought it
   just before, then waits forever for the records dropped. The consumer thread
   puts back what it is handed while flow is stopped, at once, on its own thread.

Registered as ``faust.transports`` entry points: ``timers://`` (any Kafka) and
``tansu://`` (the embedded broker profile).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message

from futures.ingress.records import SourceRecord
from futures.worker import faust_adapter, fetch, membership
from futures.worker.passed import PassedOffsets
from futures.worker.store import TimerStore

log = logging.getLogger(__name__)

Apply = Callable[[Sequence[SourceRecord]], Awaitable[None]]


@dataclass(frozen=True)
class BulkRoute:
    """Where the fetched request records go (see the module docstring, 3)."""

    request_topics: frozenset[str]
    ingest: Apply
    tick_topic: str
    #: Takes ticks as they are fetched (``TimerEngine.note_ticks``).
    note_ticks: Callable[[Sequence[SourceRecord]], None]
    #: Called when ticks came or requests were applied: what waits may fire now (``TimerEngine.wake``).
    wake: Callable[[], None]
    #: Requests per ``ingest`` call (``TIMERS_INGEST_BATCH_SIZE``).
    batch_size: int
    #: Called (on the engine's loop) when a fetch response came: a tick waiting for its
    #: partition's frontier may fire now (``TimerEngine.frontier_moved``).
    frontier_moved: Callable[[], None] = lambda: None


_routes: weakref.WeakKeyDictionary[Any, BulkRoute] = weakref.WeakKeyDictionary()  # faust.App -> route


def route_in_bulk(app: faust.App, route: BulkRoute) -> None:
    """Send ``app``'s fetched requests to ``route`` instead of Faust's streams."""
    _routes[app] = route


def _records(batches: Iterable[tuple[TP, list[Any]]]) -> list[SourceRecord]:
    """aiokafka's ConsumerRecords as SourceRecords (timestamps in epoch ms, as Kafka keeps them)."""
    return [
        SourceRecord(
            r.topic,
            r.partition,
            r.offset,
            r.key,
            r.value,
            tuple(r.headers) if r.headers else (),
            -1 if r.timestamp is None else r.timestamp,
        )
        for _, batch in batches
        for r in batch
    ]


#: How long a broker may hold a fetch with no new data (ms): a tick waits for a fetch request
#: sent after its second to be answered (the join's frontier), so at most about this long
#: when no request is written.
FETCH_MAX_WAIT_MS = 100
#: The same on the embedded broker, which holds a fetch for the whole wait even when data comes.
EMBEDDED_FETCH_MAX_WAIT_MS = 10


class TimerConsumerThread(faust_adapter.ConsumerThreadBase):
    """Faust's consumer thread, with the member id kept in the data dir (docstring, 4), committed
    transactions only (5), what a fetch hands out while flow is stopped put back (6), and fetch
    requests stamped and held briefly (2)."""

    #: How long the broker may hold a fetch with no new data (ms).
    fetch_max_wait_ms = FETCH_MAX_WAIT_MS

    def _dynamic_membership(self) -> bool:
        return self.app.conf.consumer_group_instance_id is None

    def on_consumer_created(self, consumer: Any) -> None:
        faust_adapter.read_committed(consumer)
        faust_adapter.set_fetch_max_wait(consumer, self.fetch_max_wait_ms)

    async def on_start(self) -> None:
        await super().on_start()  # creates and starts the aiokafka consumer: not yet subscribed
        # The join's frontier is when a fetch request was sent (docstring, 2): a tick waiting for
        # it looks again as each response comes, on the engine's loop.
        route, main_loop = _routes.get(self.app), self.parent_loop

        def responded() -> None:
            if route is not None and not main_loop.is_closed():
                main_loop.call_soon_threadsafe(route.frontier_moved)

        faust_adapter.stamp_fetch_requests(faust_adapter.started_consumer(self), responded)
        if self._dynamic_membership():
            await membership.leave_previous(faust_adapter.started_consumer(self), Path(self.app.conf.datadir))

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        if self._dynamic_membership():
            coordinator = faust_adapter.group_coordinator(faust_adapter.started_consumer(self))
            try:
                membership.write_member(
                    Path(self.app.conf.datadir),
                    membership.Membership(coordinator.group_id, coordinator.member_id),
                )
            except OSError as exc:  # only a restart's speed depends on it
                log.warning("could not record the consumer's member id: %r", exc)
        await super().on_partitions_assigned(assigned, generation_id)

    def on_records_fetched(self, consumer: Any, records: Mapping[TP, list[Any]]) -> Mapping[TP, list[Any]]:
        passed = fetch.take_passed()
        if passed and isinstance(self.consumer, TimerConsumer):
            # Before the records go: the engine may find the holes they leave (docstring, 5).
            self.consumer.note_passed(passed)
        if records and not self.consumer.flow_active:
            # A fetch asked for before a rebalance is answered after it (docstring, 6): put its
            # records back, so that they are read again once flow resumes.
            for tp, batch in records.items():
                if batch:
                    consumer.seek(tp, batch[0].offset)
            return {}
        return records


class TimerConsumer(faust_adapter.ConsumerBase):
    thread_class = TimerConsumerThread

    async def seek_to_committed(self) -> Mapping[TP, int]:
        positions = dict(await super().seek_to_committed())
        assignment = self.assignment()
        seeks: dict[TP, int] = {}
        for table in self.app.tables.values():
            store = table.data
            if not isinstance(store, TimerStore):
                continue
            for tp, offset in store.resume_positions(assignment).items():
                committed = positions.get(tp)
                if committed != offset:
                    log.info("%s: resuming at %d, after the last applied request (committed: %s)",
                             tp, offset, committed)  # fmt: skip
                    seeks[tp] = offset
                positions[tp] = offset
        route = _routes.get(self.app)
        request_topics = route.request_topics if route is not None else frozenset()
        for tp, position in positions.items():
            if tp.topic in request_topics and position is not None and position >= 0:
                # What Faust now counts as committed: a marker right there is acked once read past.
                self._passed.resume_at(tp, position)
        if seeks:
            # On the consumer's own thread: Faust's ``seek`` runs aiokafka's on the caller's,
            # which drops the partition's fetched records while that thread may be handing
            # them out, and the fetcher then crashes on a KeyError (robinhood/aiokafka#19).
            await self.seek_wait(seeks)
        return positions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._backlog = RequestBacklog()  # fetched requests not yet applied (docstring, 3)
        #: Offsets read past without a record (docstring, 5), as the consumer thread reports
        #: them (appended there, taken here: a deque's ends are thread-safe).
        self._reported: deque[tuple[Any, int, int]] = deque()
        self._passed = PassedOffsets()

    def note_passed(self, passed: list[tuple[Any, int, int]]) -> None:
        """The runs of offsets ``(tp, start, end)`` the consumer thread's fetches read past without
        a record; from that thread."""
        if _routes.get(self.app) is not None:  # else nothing takes them
            self._reported.extend(passed)

    def holds_no_request(self, topic: str, partition: int, start: int, end: int) -> bool:
        """Whether this consumer read past every offset of ``topic[partition]`` from ``start`` to
        ``end - 1`` without a record: they hold no request (transaction markers, records of
        aborted transactions), and a hole there needs no reading back."""
        return self._passed.covers(TP(topic, partition), start, end)

    def _take_passed(self, request_topics: frozenset[str]) -> None:
        """Keep what the consumer thread reported of the request partitions, and ack the offsets
        that continue what is applied."""
        reported = self._reported
        while reported:
            tp, start, end = reported.popleft()
            if tp.topic in request_topics:
                tp = TP(tp.topic, tp.partition)
                self._ack_spans(tp, self._passed.add(tp, start, end))

    def _ack_spans(self, tp: TP, spans: list[tuple[int, int]]) -> None:
        for start, end in spans:
            faust_adapter.ack_offsets(self, tp, range(start, end))

    def partitions_to_fetch(self, active: set[TP]) -> set[TP]:
        route = _routes.get(self.app)
        if route is None:
            return active
        backlog = self._backlog
        # Called before each hand-over: what was handed over before is in hand or applied.
        backlog.taken_to(
            {
                tp: faust_adapter.fetch_position(self, tp).position
                for tp in active
                if tp.topic in route.request_topics
            }
        )
        if (
            backlog.records >= route.batch_size * BACKLOG_STEPS
            or backlog.bytes >= CHUNK_BYTES * BACKLOG_STEPS
        ):
            # Enough requests in hand, by count or by bytes whatever their size: fetch no more
            # of the partitions they are of until the engine catches up. Ticks, and the request
            # partitions with nothing in hand, are still fetched: their frontier must stay known.
            held = backlog.partitions()
            return {tp for tp in active if tp not in held}
        return active

    def frontier_ms(self, partition: int) -> int | None:
        """Epoch ms before which every request of ``partition`` is applied (see
        :mod:`futures.worker.join`; None: no request topic). From what this consumer fetched
        and the high watermarks of the fetch responses, and when their requests were sent
        (ListOffsets under-reports on the embedded broker)."""
        route = _routes.get(self.app)
        if route is None:
            return None
        tps = (TP(topic, partition) for topic in route.request_topics)
        return min(
            (self._backlog.frontier_ms(tp, faust_adapter.fetch_position(self, tp)) for tp in tps),
            default=None,
        )

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        route = _routes.get(self.app)
        if route is None:  # an app without an engine (tools, tests of the store): plain Faust
            async for item in super().getmany(timeout):
                yield item
            return
        # With requests in hand, only take what the fetcher has already: they are applied below.
        records, active = await faust_adapter.wait_next_records(self, 0 if self._backlog else timeout)
        if records is None or self.should_stop:
            return
        if not self.flow_active:  # as Faust does: a rebalance is on, positions are reset
            self._backlog.clear()  # not acked: read again by whoever owns them now
            self._passed.clear()
            try:
                await self.perform_seek()
            except Exception as exc:  # noqa: BLE001 - Faust's own handling: logged, retried
                log.warning("exception performing seek when flow not active: %r", exc)
            return
        # Before the step below: the engine may find the holes they explain. Left for later
        # during a rebalance, so that only what the new assignment applied is acked on.
        self._take_passed(route.request_topics)
        generation = self.app.consumer_generation_id
        rest = {}
        for tp, batch in records.items():
            if not batch or not (active is None or tp in active or faust_adapter.is_buffered(self, tp)):
                continue
            if tp.topic in route.request_topics:
                self._backlog.add(tp, batch, generation)
            else:
                rest[tp] = batch
        # Ticks go to the engine as they come (its firing task runs beside the ingest below);
        # replaying one is harmless, so they are acked at once.
        ticks = [(tp, rest.pop(tp)) for tp in list(rest) if tp.topic == route.tick_topic]
        if ticks:
            route.note_ticks(_records(ticks))
            for tp, batch in ticks:
                faust_adapter.ack_offsets(self, tp, [r.offset for r in batch])
            route.wake()
        # Anything else (table changelogs while recovering) takes Faust's path.
        for tp, record in self.scheduler.iterate(rest):
            if self.app.consumer_generation_id != generation:
                break
            yield tp, faust_adapter.to_message(self, tp, record)
        # One engine step per call, so the ticks of the next fetch wait for one step at
        # most, never for everything one fetch brought (up to megabytes of requests).
        step = self._backlog.take(generation, route.batch_size)
        if step:
            done = False
            try:
                done = await self._apply(route.ingest, step, generation)
            finally:
                self._backlog.applied(step, done)
            route.wake()  # ticks waiting for these requests may fire now

    async def _apply(self, apply: Apply, batches: list[tuple[TP, list[Any]]], generation: int) -> bool:
        """Apply ``batches`` and ack them; False if they were left to be read again."""
        if self.app.consumer_generation_id != generation:
            return False  # fetched before a rebalance: not acked, so read again by whoever owns them now
        try:
            # Shielded: a stop cancels the fetcher that runs this, and a step cut short leaves
            # part of its changelog records written and its requests to be read again.
            await asyncio.shield(apply(_records(batches)))
        except Exception as exc:
            # Nothing of the batch was acked; stop the worker so it restarts and
            # reads the batch again, instead of skipping it.
            log.critical("applying fetched records failed, stopping the worker: %r", exc, exc_info=True)
            await self.app.crash(exc)
            raise
        monitor = self.app.monitor
        for tp, batch in batches:
            faust_adapter.ack_offsets(self, tp, [r.offset for r in batch])
            self._ack_spans(tp, self._passed.applied(tp, batch[-1].offset))
            if monitor is not None:
                # What Faust's stream records for each event it takes in: without it, Faust's
                # liveness check logs "Stream has not started processing" errors for every
                # request partition while the worker works through a backlog for a while.
                faust_adapter.note_stream_activity(monitor, tp)
        return True


#: At most this many bytes of request values per ``ingest`` call: a FutureBatch record holds up to
#: ~1,000 timers, and one call holds the engine lock (a tick waits) until all it got is durable.
CHUNK_BYTES = 1_000_000


class RequestBacklog:
    """Request records fetched but not yet applied, oldest first; each batch remembers the
    consumer generation it was fetched in (after a rebalance it may be another worker's)."""

    def __init__(self) -> None:
        self._batches: deque[tuple[TP, list[Any], int]] = deque()
        self.records = 0
        self.bytes = 0  # of the values in hand
        #: Per partition, the timestamp of the oldest record of the step being applied: until
        #: it is, its records are the first not applied.
        self._applying: dict[TP, int] = {}
        #: Per partition, the timestamp of the last record applied (since the last
        #: rebalance): how far its requests are known applied.
        self._applied_ms: dict[TP, int] = {}
        #: Per partition, the offset before which every record is taken in hand or applied:
        #: a position past it means records are on their way from the fetcher.
        self._taken_to: dict[TP, int] = {}

    def __bool__(self) -> bool:
        return bool(self._batches)

    def add(self, tp: TP, batch: list[Any], generation: int) -> None:
        self._batches.append((tp, batch, generation))
        self.records += len(batch)
        self.bytes += sum(len(r.value or b"") for r in batch)
        self._taken_to[tp] = batch[-1].offset + 1

    def taken_to(self, positions: Mapping[TP, int | None]) -> None:
        """Every record of these partitions before these offsets is taken in hand or applied
        (none is on its way from the fetcher); None: not known."""
        for tp, position in positions.items():
            if position is not None:
                self._taken_to[tp] = position

    def clear(self) -> None:
        self._batches.clear()
        self.records = self.bytes = 0
        self._applied_ms.clear()
        self._taken_to.clear()

    def partitions(self) -> set[TP]:
        """The partitions of which records are in hand."""
        return {tp for tp, _, _ in self._batches}

    def frontier_ms(self, tp: TP, fetching: faust_adapter.FetchPosition) -> int:
        """Epoch ms before which every record of ``tp`` is applied.

        The oldest record of the step being applied, else the oldest in hand, is the
        first not applied. With none, the consumer has handed over everything up to the
        ``position`` of ``fetching`` (the next offset to come), and all of it is in hand
        unless the position is past what was taken (records on their way from the
        fetcher). If the broker's ``highwater`` was not past the position either, every
        record written before the request of that fetch response was sent is applied: that
        time, which is before the broker answered, is the frontier (not when the answer was
        read: a record written in between is in no response yet). A high watermark says
        nothing of what was written after its response —
        a partition left out of fetches while its backlog drains has an old one — so a tick
        of a later second waits for a newer response. Otherwise the broker holds more,
        written after the last record applied (-1: none known yet, so nothing may pass
        until they are read).
        """
        applying = self._applying.get(tp)
        if applying is not None:
            return max(applying, 0)
        for batch_tp, batch, _ in self._batches:
            if batch_tp == tp:
                return max(_timestamp_ms(batch[0]), 0)
        highwater, position, fetched_ms = fetching
        if (
            highwater is not None
            and position is not None
            and fetched_ms is not None
            and highwater <= position <= self._taken_to.get(tp, position)
        ):
            return fetched_ms
        return self._applied_ms.get(tp, -1)

    def take(self, generation: int, size: int) -> list[tuple[TP, list[Any]]]:
        """The next engine step: the oldest records of ``generation``, at most ``size`` of them
        or about :data:`CHUNK_BYTES` of values, a partition's in order. Older generations' go."""
        step: list[tuple[TP, list[Any]]] = []
        count = volume = 0
        batches = self._batches
        while batches and count < size and volume < CHUNK_BYTES:
            tp, batch, fetched_in = batches.popleft()
            if fetched_in != generation:
                self.records -= len(batch)  # not acked: read again by whoever owns them now
                self.bytes -= sum(len(r.value or b"") for r in batch)
                continue
            end = 0
            while end < len(batch) and count < size and volume < CHUNK_BYTES:
                volume += len(batch[end].value or b"")
                count += 1
                end += 1
            step.append((tp, batch[:end]))
            if end:
                self._applying.setdefault(tp, _timestamp_ms(batch[0]))
            if end < len(batch):
                batches.appendleft((tp, batch[end:], fetched_in))
            self.records -= end
        self.bytes -= volume  # the values of the records taken: those of other generations went above
        return step

    def applied(self, step: list[tuple[TP, list[Any]]], done: bool = True) -> None:
        """The engine is done with ``step``: applied (``done``), or left to be read again, when
        its records count as applied no more than before it was taken."""
        for tp, part in step:
            self._applying.pop(tp, None)
            if part and done:
                self._applied_ms[tp] = max(_timestamp_ms(part[-1]), self._applied_ms.get(tp, -1))


def _timestamp_ms(record: Any) -> int:
    return -1 if record.timestamp is None else int(record.timestamp)


#: Engine steps of requests the consumer holds before it fetches only ticks (see
#: ``TimerConsumer.partitions_to_fetch``): enough to keep the engine busy between fetches.
BACKLOG_STEPS = 4


class TimerTransport(faust_aiokafka.Transport):
    Consumer = TimerConsumer


class ShortFetchConsumerThread(TimerConsumerThread):
    fetch_max_wait_ms = EMBEDDED_FETCH_MAX_WAIT_MS


class ShortFetchConsumer(TimerConsumer):
    thread_class = ShortFetchConsumerThread


class EmbeddedBrokerTransport(TimerTransport):
    Consumer = ShortFetchConsumer
