"""Every use the worker makes of a private part of Faust, aiokafka or mode, in one place.

The worker needs a few things these libraries offer no public way to do: book
offsets as acked without Message objects, know how far a fetch has read, shorten
aiokafka's fetch wait, read only committed transactions, put back what a fetch
handed out too late, reach the consumer group's coordinator, subscribe tables
without Faust's start-up sleep, unpack fetches whose header keys are not UTF-8,
and learn which offsets a fetch read past without a record to hand out. Each is reached here and
nowhere else, through a small named function, or a base class that turns a
private hook we must override into a named one; each docstring says what it
relies on and why the worker needs it.

:data:`RELIES_ON` lists every such name with the shape used here, and
:data:`MIRRORED` the library methods whose behaviour code here or in the
transport copies. tests/worker/test_faust_adapter.py checks both against the
installed versions (those pinned in constraints.txt) and fails naming what
changed; after an upgrade, read the entry's ``used_by`` before changing it.
"""

from __future__ import annotations

import abc
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, SupportsIndex

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.structs import TopicPartition
from faust.stores.base import SerializedStore
from faust.tables import TableManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message


@dataclass(frozen=True)
class Reliance:
    """One name of Faust, aiokafka or mode that no public API promises, and that the worker uses."""

    #: Where it lives: a module, or a class as ``module.Class``.
    owner: str
    name: str
    #: A callable's parameters as ``inspect.signature`` prints them without annotations and
    #: with ``...`` for any default (``async`` first for a coroutine function); else
    #: ``attribute`` (set on instances), ``property``, ``class`` or ``module attribute``.
    shape: str
    #: What in this module uses it.
    used_by: str


@dataclass(frozen=True)
class Mirrored:
    """A library method whose behaviour the worker copies: a change to it needs a look at the copy."""

    owner: str
    name: str
    #: The first 16 hex digits of the SHA-256 of its dedented source.
    source_sha256: str
    #: Where the copy is.
    copied_by: str


AIOKafkaConsumerThread = faust_aiokafka.AIOKafkaConsumerThread

_CONSUMER = "faust.transport.drivers.aiokafka.Consumer"
_THREAD = "faust.transport.drivers.aiokafka.AIOKafkaConsumerThread"
_AIOKAFKA = "aiokafka.consumer.consumer.AIOKafkaConsumer"
_STATE = "aiokafka.consumer.subscription_state"
_COORDINATOR = "aiokafka.consumer.group_coordinator.GroupCoordinator"
_STORE = "faust.stores.base.SerializedStore"
_PYTHON_BATCH = "aiokafka.record.default_records._DefaultRecordBatchPy"
_PARTITION_RECORDS = "aiokafka.consumer.fetcher.PartitionRecords"

RELIES_ON: tuple[Reliance, ...] = (
    # Faust's consumer: its ack books and fetch loop.
    Reliance(_CONSUMER, "_committed_offset", "attribute", "ack_offsets"),
    Reliance(_CONSUMER, "_acked_index", "attribute", "ack_offsets"),
    Reliance(_CONSUMER, "_acked", "attribute", "ack_offsets"),
    Reliance(_CONSUMER, "_n_acked", "attribute", "ack_offsets"),
    Reliance(_CONSUMER, "_read_offset", "attribute", "ack_offsets"),
    Reliance(_CONSUMER, "_wait_next_records", "async (self, timeout)", "wait_next_records"),
    Reliance(_CONSUMER, "_buffered_partitions", "attribute", "is_buffered"),
    Reliance(_CONSUMER, "_to_message", "(self, tp, record)", "to_message"),
    Reliance(_CONSUMER, "_thread", "attribute", "fetch_position"),
    Reliance(_CONSUMER, "_new_consumer_thread", "(self)", "ConsumerBase"),
    Reliance(_CONSUMER, "_getmany", "async (self, active_partitions, timeout)", "ConsumerBase"),
    Reliance("faust.sensors.monitor.Monitor", "stream_inbound_time", "attribute", "note_stream_activity"),
    # Faust's consumer thread and the aiokafka consumer it holds.
    Reliance(_THREAD, "_consumer", "attribute", "fetch_position"),
    Reliance(_THREAD, "_ensure_consumer", "(self)", "started_consumer"),
    Reliance(_THREAD, "_create_worker_consumer", "(self, transport)", "ConsumerThreadBase"),
    Reliance(
        _THREAD,
        "_fetch_records",
        "async (self, consumer, active_partitions, timeout=..., max_records=...)",
        "ConsumerThreadBase",
    ),
    Reliance(_AIOKAFKA, "_subscription", "attribute", "fetch_position"),
    Reliance(_AIOKAFKA, "_fetch_max_wait_ms", "attribute", "set_fetch_max_wait"),
    Reliance(_AIOKAFKA, "_isolation_level", "attribute", "read_committed"),
    Reliance(_AIOKAFKA, "_coordinator", "attribute", "group_coordinator"),
    Reliance(_AIOKAFKA, "_client", "attribute", "send_to_coordinator"),
    Reliance(
        "aiokafka.client.AIOKafkaClient",
        "send",
        "async (self, node_id, request, *, group=...)",
        "send_to_coordinator",
    ),
    Reliance(f"{_STATE}.SubscriptionState", "subscription", "property", "fetch_position"),
    Reliance(f"{_STATE}.Subscription", "assignment", "property", "fetch_position"),
    Reliance(f"{_STATE}.Assignment", "tps", "property", "fetch_position"),
    Reliance(f"{_STATE}.Assignment", "state_value", "(self, tp)", "fetch_position"),
    Reliance(f"{_STATE}.TopicPartitionState", "highwater", "attribute", "fetch_position"),
    Reliance(f"{_STATE}.TopicPartitionState", "timestamp", "attribute", "stamp_fetch_requests"),
    Reliance(_AIOKAFKA, "_fetcher", "attribute", "stamp_fetch_requests"),
    Reliance(
        "aiokafka.consumer.fetcher.Fetcher",
        "_proc_fetch_request",
        "async (self, assignment, node_id, request)",
        "stamp_fetch_requests",
    ),
    Reliance(f"{_STATE}.TopicPartitionState", "position", "property", "fetch_position"),
    Reliance(f"{_STATE}.TopicPartitionState", "has_valid_position", "property", "fetch_position"),
    Reliance(_COORDINATOR, "group_id", "attribute", "group_coordinator"),
    Reliance(_COORDINATOR, "member_id", "attribute", "group_coordinator"),
    Reliance(_COORDINATOR, "coordinator_id", "attribute", "send_to_coordinator"),
    Reliance(_COORDINATOR, "ensure_coordinator_known", "async (self)", "group_coordinator"),
    # Faust's table manager and store.
    Reliance("faust.tables.manager.TableManager", "_update_channels", "async (self)", "start_table_manager"),
    Reliance(_STORE, "_get", "(self, key)", "StoreBase"),
    Reliance(_STORE, "_set", "(self, key, value)", "StoreBase"),
    Reliance(_STORE, "_del", "(self, key)", "StoreBase"),
    Reliance(_STORE, "_iterkeys", "(self)", "StoreBase"),
    Reliance(_STORE, "_itervalues", "(self)", "StoreBase"),
    Reliance(_STORE, "_iteritems", "(self)", "StoreBase"),
    Reliance(_STORE, "_size", "(self)", "StoreBase"),
    Reliance(_STORE, "_contains", "(self, key)", "StoreBase"),
    Reliance(_STORE, "_clear", "(self)", "StoreBase"),
    # aiokafka's record unpacking.
    Reliance("aiokafka.consumer.fetcher", "MemoryRecords", "module attribute", "use_fetch_records"),
    Reliance("aiokafka.record.default_records", "_DefaultRecordBatchPy", "class", "LenientPythonBatch"),
    Reliance(_PYTHON_BATCH, "_buffer", "attribute", "LenientPythonBatch"),
    Reliance(_PYTHON_BATCH, "_maybe_uncompress", "(self)", "LenientPythonBatch"),
    # aiokafka's reader of one partition's fetched records.
    Reliance("aiokafka.consumer.fetcher", "PartitionRecords", "module attribute", "use_partition_records"),
    Reliance(_PARTITION_RECORDS, "_unpack_records", "(self)", "PartitionRecordsBase"),
    Reliance(_PARTITION_RECORDS, "_tp", "attribute", "PartitionRecordsBase"),
)

MIRRORED: tuple[Mirrored, ...] = (
    Mirrored("faust.transport.consumer.Consumer", "ack", "5548cf0f75843f73", "ack_offsets"),
    Mirrored(
        "faust.transport.consumer.Consumer",
        "getmany",
        "e486c434b7928ee8",
        "futures.worker.transport.TimerConsumer.getmany",
    ),
    Mirrored(_CONSUMER, "_new_consumer_thread", "8fd0d41b15145615", "ConsumerBase._new_consumer_thread"),
    Mirrored("faust.tables.manager.TableManager", "on_start", "b82e759be50ccebe", "start_table_manager"),
)


# -- Faust's consumer --------------------------------------------------------------------------


def ack_offsets(consumer: faust_aiokafka.Consumer, tp: TP, offsets: Sequence[int]) -> None:
    """Book ``offsets`` of ``tp`` as acked, as ``Consumer.ack`` does for each message.

    Request records reach the engine as fetched batches, never as Message objects
    (see :mod:`futures.worker.transport`), so Faust's ``ack`` cannot be called; its
    periodic commit then commits what is booked here like any stream's acks. Relies
    on the books ``ack`` keeps (``_committed_offset``, ``_acked_index``, ``_acked``,
    ``_n_acked``) and on ``_read_offset``, which Faust's drain loop sets per event.
    ``offsets`` are distinct, as a fetched batch's are.
    """
    committed = consumer._committed_offset[tp]
    index = consumer._acked_index[tp]
    new = [o for o in offsets if (committed is None or o >= committed) and o not in index]
    index.update(new)
    consumer._acked[tp].extend(new)
    consumer._n_acked += len(new)
    consumer._read_offset[tp] = offsets[-1]


async def wait_next_records(
    consumer: faust_aiokafka.Consumer, timeout: float
) -> tuple[Mapping[TP, list[Any]] | None, set[TP] | None]:
    """The records of the next fetch and the partitions it asked for (None: any), or (None, None).

    The first half of Faust's ``Consumer.getmany`` (``_wait_next_records``): it waits
    while flow control is suspended and fetches only the active partitions. The
    transport's ``getmany`` does the second half its own way (batches, not events).
    """
    return await consumer._wait_next_records(timeout)


def is_buffered(consumer: faust_aiokafka.Consumer, tp: TP) -> bool:
    """Whether Faust counts ``tp`` as buffered (``_buffered_partitions``): its records are taken
    even if it was not among the partitions fetched, as Faust's ``getmany`` does."""
    return tp in consumer._buffered_partitions


def to_message(consumer: faust_aiokafka.Consumer, tp: TP, record: Any) -> Message:
    """aiokafka's ``record`` as the Message Faust's streams take (``_to_message``): what the
    transport yields for records it leaves to Faust (table changelogs while recovering)."""
    return consumer._to_message(tp, record)


def note_stream_activity(monitor: Any, tp: TP) -> None:
    """Record activity on ``tp`` as Faust's stream does for each event it takes in.

    Faust's liveness check reads ``Monitor.stream_inbound_time``; requests skip the
    stream, so without this it logs "Stream has not started processing" errors for
    every request partition while the worker works through a backlog.
    """
    monitor.stream_inbound_time[tp] = time.monotonic()


class FetchPosition(NamedTuple):
    """Where a partition's fetching stands, as aiokafka knows it; None where not known (yet)."""

    #: The next offset the broker writes, as the last fetch response of the partition said.
    highwater: int | None
    #: The next offset aiokafka hands over.
    position: int | None
    #: When the fetch request that response answered was sent (epoch ms, this worker's clock):
    #: the broker answered it later, so every record written before this time was in the
    #: partition below ``highwater`` (see :func:`stamp_fetch_requests`).
    fetched_ms: int | None


#: aiokafka's per-partition fetch state → when the request its last response answered was sent.
_REQUESTED: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def stamp_fetch_requests(consumer: AIOKafkaConsumer, on_response: Callable[[], None]) -> None:
    """Record, per partition, when the fetch request its last response answered was sent, and
    call ``on_response`` (on the consumer's thread) after each response is taken in.

    aiokafka stamps a partition's state (``timestamp``) when it *processes* a fetch response,
    which is later than the broker wrote it: a request written in between is in no response
    yet, and a frontier taken at that time would let a tick pass it. The time the request was
    sent is earlier than the broker's answer, so it is a time before which every record
    written is in the response (as far as this worker's clock agrees with the producers').

    Wraps the started consumer's ``Fetcher._proc_fetch_request`` (one coroutine per request,
    run on the consumer's thread): the time is taken before the request goes, and recorded
    for the partitions whose state the response stamped, after aiokafka wrote their high
    watermark, so a reader that reads it first never pairs it with an older high watermark.
    """
    fetcher = consumer._fetcher
    process = fetcher._proc_fetch_request

    async def stamped(assignment: Any, node_id: Any, request: Any) -> Any:
        sent_ms = time.time_ns() // 1_000_000
        states = [
            assignment.state_value(TopicPartition(topic, partition[0]))
            for topic, partitions in request.topics
            for partition in partitions
        ]
        before = [state.timestamp for state in states]
        try:
            return await process(assignment, node_id, request)
        finally:
            for state, stamp in zip(states, before, strict=True):
                if state.timestamp != stamp:  # this response's
                    _REQUESTED[state] = sent_ms
            on_response()

    fetcher._proc_fetch_request = stamped


def fetch_position(consumer: faust_aiokafka.Consumer, tp: TP) -> FetchPosition:
    """aiokafka's :class:`FetchPosition` of ``tp``.

    Both offsets come from fetch responses, which the join's frontier needs because
    ListOffsets under-reports the end of a partition on the embedded broker. Relies on
    Faust's consumer thread holding the aiokafka consumer (``_thread._consumer``, None
    until it starts) and on aiokafka's per-partition fetch state
    (``_subscription.subscription.assignment.state_value(tp)``), whose ``highwater`` the
    fetcher sets from every fetch response, on its thread, before
    :func:`stamp_fetch_requests` records when that response's request was sent: the time
    is read first, so that a high watermark is never older than it. None until a
    consumer stamped by :func:`stamp_fetch_requests` has had a response.
    """
    unknown = FetchPosition(None, None, None)
    running = consumer._thread._consumer
    if running is None:
        return unknown
    assignment = running._subscription.subscription
    if assignment is None or tp not in assignment.assignment.tps:
        return unknown
    state = assignment.assignment.state_value(tp)
    fetched_ms = _REQUESTED.get(state)
    return FetchPosition(state.highwater, state.position if state.has_valid_position else None, fetched_ms)


class ConsumerBase(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer, with the private hooks the worker overrides given names."""

    #: The consumer thread this consumer runs (Faust's ``_new_consumer_thread`` names its own).
    thread_class: ClassVar[type[AIOKafkaConsumerThread]] = AIOKafkaConsumerThread

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(self, active_partitions: set[TP] | None, timeout: float) -> Mapping[TP, list[Any]]:
        # The fetch alone is narrowed: Faust's pause and resume (table recovery's among them)
        # change the set ``_get_active_partitions`` returns, and must reach the live one.
        if active_partitions is None:  # a client-only app: every assigned partition
            return await super()._getmany(active_partitions, timeout)
        wanted = self.partitions_to_fetch(active_partitions)
        if not wanted:  # aiokafka reads no partitions as all of them
            return {}
        return await super()._getmany(wanted, timeout)

    def partitions_to_fetch(self, active: set[TP]) -> set[TP]:
        """Of ``active`` (the assigned partitions flow control has not paused), those the next
        fetch asks for: ``active`` itself, or a new set."""
        return active


# -- Faust's consumer thread and its aiokafka consumer -------------------------------------------


def started_consumer(thread: faust_aiokafka.AIOKafkaConsumerThread) -> AIOKafkaConsumer:
    """The aiokafka consumer of ``thread`` (``_ensure_consumer``); raises if it has not started."""
    return thread._ensure_consumer()


def group_coordinator(consumer: AIOKafkaConsumer) -> Any:
    """aiokafka's group coordinator of ``consumer`` (``_coordinator``), None before it starts.

    The worker reads its ``group_id`` and ``member_id`` to record the member it
    joined as, and uses ``ensure_coordinator_known`` and ``coordinator_id`` to
    remove a dead incarnation from the group (:mod:`futures.worker.membership`):
    aiokafka has no public way to name a consumer's member or to send a request
    to its coordinator.
    """
    return consumer._coordinator


async def send_to_coordinator(consumer: AIOKafkaConsumer, coordinator: Any, request: Any) -> Any:
    """Send ``request`` to the group coordinator through ``consumer``'s client (``_client``);
    its response. ``coordinator`` is :func:`group_coordinator`'s, its coordinator known."""
    return await consumer._client.send(coordinator.coordinator_id, request)


def set_fetch_max_wait(consumer: AIOKafkaConsumer, wait_ms: int) -> None:
    """How long the broker may hold a fetch of ``consumer`` with no new data (ms).

    Faust builds its aiokafka consumer with ``fetch_max_wait_ms=1500`` and no
    setting; aiokafka hands ``_fetch_max_wait_ms`` to its Fetcher in ``start()``,
    so this must run before.
    """
    consumer._fetch_max_wait_ms = wait_ms


def read_committed(consumer: AIOKafkaConsumer) -> None:
    """Make ``consumer`` read only records of committed transactions (and those of no transaction).

    Faust builds its aiokafka consumer with ``isolation_level="read_uncommitted"`` unless
    its own app runs transactions (``processing_guarantee="exactly_once"``), and has no
    setting for it; aiokafka hands ``_isolation_level`` to its Fetcher in ``start()``,
    so this must run before. The fetcher then leaves out the batches the fetch response
    names as aborted, and moves its position past them.
    """
    consumer._isolation_level = "read_committed"


class ConsumerThreadBase(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer thread, with the private hooks the worker overrides given names."""

    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        self.on_consumer_created(consumer)
        return consumer

    def on_consumer_created(self, consumer: AIOKafkaConsumer) -> None:
        """Adjust the worker's aiokafka consumer, created but not yet started."""

    async def _fetch_records(
        self,
        consumer: AIOKafkaConsumer,
        active_partitions: set[TP],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Mapping[TP, list[Any]]:
        records = await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )
        return self.on_records_fetched(consumer, records)

    def on_records_fetched(
        self, consumer: AIOKafkaConsumer, records: Mapping[TP, list[Any]]
    ) -> Mapping[TP, list[Any]]:
        """What a fetch hands to Faust's consumer of ``records``, which aiokafka's ``consumer``
        has just handed out, its positions now past them.

        Called on the consumer's thread as Faust's ``_fetch_records`` returns what aiokafka's
        ``fetched_records`` gave, with nothing run in between: a seek here puts them back exactly.
        """
        return records


# -- Faust's table manager and store --------------------------------------------------------------


async def start_table_manager(manager: TableManager) -> None:
    """What ``TableManager.on_start`` does, without its one-second sleep first.

    Faust sleeps so that tables declared while the worker starts are registered
    before it subscribes; relies on ``_update_channels``, which subscribes the
    tables' changelogs and starts the tables.
    """
    if not manager.should_stop:
        await manager._update_channels()
        await manager.recovery.start()


class StoreBase(SerializedStore):
    """Faust's store of serialized keys and values, its abstract private hooks given names."""

    def _get(self, key: bytes) -> bytes | None:
        return self.raw_get(key)

    def _set(self, key: bytes, value: bytes | None) -> None:
        self.raw_set(key, value)

    def _del(self, key: bytes) -> None:
        self.raw_del(key)

    def _iterkeys(self) -> Iterator[bytes]:
        return self.raw_keys()

    def _itervalues(self) -> Iterator[bytes | None]:
        return self.raw_values()

    def _iteritems(self) -> Iterator[tuple[bytes, bytes]]:
        return self.raw_items()

    def _size(self) -> int:
        return self.raw_size()

    def _contains(self, key: bytes) -> bool:
        return self.raw_contains(key)

    def _clear(self) -> None:
        self.raw_clear()

    @abc.abstractmethod
    def raw_get(self, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    def raw_set(self, key: bytes, value: bytes | None) -> None: ...

    @abc.abstractmethod
    def raw_del(self, key: bytes) -> None: ...

    @abc.abstractmethod
    def raw_keys(self) -> Iterator[bytes]: ...

    @abc.abstractmethod
    def raw_values(self) -> Iterator[bytes | None]: ...

    @abc.abstractmethod
    def raw_items(self) -> Iterator[tuple[bytes, bytes]]: ...

    @abc.abstractmethod
    def raw_size(self) -> int: ...

    @abc.abstractmethod
    def raw_contains(self, key: bytes) -> bool: ...

    @abc.abstractmethod
    def raw_clear(self) -> None: ...


# -- aiokafka's record unpacking ------------------------------------------------------------------


class LenientBytes(bytes):
    """Bytes whose ``decode`` always escapes what is not valid (``surrogateescape``)."""

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return super().decode(encoding, "surrogateescape")


class LenientBuffer(bytearray):
    """A batch buffer whose slices are :class:`LenientBytes`."""

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        item = super().__getitem__(index)
        return LenientBytes(item) if isinstance(index, slice) else item


class LenientPythonBatch(_DefaultRecordBatchPy):
    """aiokafka's pure-Python reader of one record batch, with header keys that never fail to decode.

    Relies on ``_DefaultRecordBatchPy`` reading records from ``self._buffer``, which
    its ``_maybe_uncompress`` sets (decompressed) before the first record is read,
    and decoding a header key by calling ``decode("utf-8")`` on a slice of it.
    """

    _buffer: bytearray

    def _maybe_uncompress(self) -> None:
        super()._maybe_uncompress()
        if not isinstance(self._buffer, LenientBuffer):
            self._buffer = LenientBuffer(self._buffer)


class PartitionRecordsBase(fetcher.PartitionRecords):
    """aiokafka's reader of one partition's fetched records, telling which offsets it reads past
    without a record to hand out: transaction markers, batches of aborted transactions (with
    ``read_committed``), records compaction removed.

    Relies on ``_unpack_records`` being the generator ``__init__`` takes the records from,
    starting at ``next_fetch_offset`` (the fetch offset, where aiokafka's position stood when
    it fetched), and leaving ``next_fetch_offset`` past every batch it has read; aiokafka moves
    the partition's position to ``next_fetch_offset`` as it hands records out, and drops the
    reader when the position was moved otherwise (a seek). So the offsets reported lie between
    records this reader handed out, or before the position it leaves: none was handed out, by
    this reader or any other.
    """

    _tp: Any

    def _unpack_records(self) -> Iterator[Any]:
        expected = self.next_fetch_offset
        for record in super()._unpack_records():
            if record.offset > expected:
                self.on_passed(self._tp, expected, record.offset)
            expected = record.offset + 1
            yield record
        if self.next_fetch_offset > expected:
            self.on_passed(self._tp, expected, self.next_fetch_offset)

    def on_passed(self, tp: Any, start: int, end: int) -> None:
        """Offsets ``start`` to ``end - 1`` of ``tp`` hold no record to hand out; called on the thread
        that reads the records, as soon as it knows."""


def use_partition_records(records: type[PartitionRecordsBase]) -> None:
    """Make every aiokafka consumer of this process read fetched partitions with ``records``.

    aiokafka's fetcher builds each partition's reader with ``PartitionRecords(...)``, looked
    up in its module when called.
    """
    fetcher.PartitionRecords = records


def use_fetch_records(records: Callable[[bytes], Any]) -> None:
    """Make every aiokafka consumer of this process unpack fetch responses with ``records``.

    aiokafka's fetcher builds each partition's records with ``MemoryRecords(data)``,
    looked up in its module when called, and uses their ``has_next``, ``next_batch``
    and ``size_in_bytes``.
    """
    fetcher.MemoryRecords = records
