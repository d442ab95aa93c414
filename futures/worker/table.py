"""The timer table of one partition: pending timers in RocksDB, ordered by due time.

Keys (bytes, compared bytewise by RocksDB):

=====================  ==========================  ======================
key                    value                       in the changelog?
=====================  ==========================  ======================
``t`` + due_ms(8) + id  ``StoredTimer``             yes (tombstone = fired/cancelled)
``f`` + sequence(8)     keys of fired timers        yes (tombstone = swept)
``m:progress``          watermark second (8) and    yes
                       last applied request
                       offset (8), signed
``m:progress:`` + topic last applied offset (8)     yes
                       of another ingress topic
``m:applying:`` + topic the last offset of the      yes: first in a write, so a
                       step a write is of (8)      table holding its timers knows
                                                   (:meth:`~PartitionTimers.may_hold`)
``i`` + id              due_ms(8)                   no: derived index for cancel/replace,
(column family ``ids``)                            valid while its timer is there
``m:pending``           count (8)                   no: derived
``m:offset``            changelog offset (8)        no: how far the changelog is applied
``m:owner:`` + epoch    epoch (8)                   yes: an owner started writing
                                                   (:mod:`futures.worker.fencing`)
``m:epochs``            highest owner epoch met and  no: derived
                       the epoch this table's
                       owner writes under (8 each)
``m:stale``             empty                       no: rebuild from the changelog
``m:current``           wall-clock ms (8)           no: when the table last held every
                                                   record of its changelog partition
=====================  ==========================  ======================

A firing deletes the timers it fired with ``f`` records, each listing the keys of
thousands of them (:meth:`PartitionTimers.fired_records`): one record where a
tombstone per timer would cost a produce and a delivery report each. Applied, live
or replayed, an ``f`` record deletes the timers it lists, so a table rebuilt from the
changelog is the same either way; it stays in the table until the sweep
(:mod:`futures.worker.sweep`) has written each listed timer's own tombstone, for
compaction, and then its own. Applied live, an ``f`` record whose timers are all the
table holds from its first to its last (a firing's, as a rule: they were scanned
together) deletes them with one RocksDB range tombstone, not one tombstone each
(:func:`~futures.worker.table_write.fill`). A live firing leaves the fired timers' id
index entries (deleting each is a random insert into the memtable, on the path between
a tick and its callbacks): the sweep's write deletes them, and until then an entry counts only
while its timer is in the table. The sweep reads an entry before it deletes it (the id
may have been put again since it fired) only where it cannot know it unread
(:meth:`PartitionTimers.trust_listings`).

The progress record closes every changelog write. Its request offset makes
applying `timer-request` idempotent: records at or below it were applied
already, and are skipped when a restarted or new owner reads them again from
an older committed consumer offset — otherwise a re-read request for a timer
that has fired would fire it again. Each other ingress topic feeding this
partition (``TIMERS_INGRESS_TOPICS``) has its own ``m:progress:<topic>`` record,
written in the same changelog write after the records it covers, once the dead
letters and events they caused are delivered, and before the closing
``m:progress``; a table written before those existed simply has none (its
``m:progress`` offset was, and stays, `timer-request`'s).

A table on disk is a cache of its changelog partition, caught up from its persisted
offset when its partition is assigned: exact only while the changelog still holds the
tombstones written since. ``m:current`` says since when (:attr:`PartitionTimers.current_ms`:
each progress record that lands marks it, as does a completed recovery), and the store
rebuilds a table whose tombstones may have expired (:mod:`futures.worker.changelog_topic`).

Because the due time leads the key, "every timer due by second s" is one
forward range scan, and scheduling k timers into one second is k puts.

Scans start at the watermark: below it lie the tombstones of fired timers, and
only the few timers that came due there and are still to fire — accepted late,
or kept after a transient callback failure. The lowest of those is the table's
**low mark** (:attr:`PartitionTimers.low_ms`), where scans start instead.
Every mutation — live or replayed from the changelog — goes through
:meth:`PartitionTimers.apply`, so a table rebuilt from its changelog is the
table that wrote it.

The id index has a column family of its own, ``ids``, with its own memtables and
SST files, and only those carry bloom filters. Every request looks its id up there
and nearly every id is new, so nearly every lookup is a bloom filter saying "not
here", file by file. With the index among the timers, every file held both, and the
timers' filters, never asked, took their share of the block cache, and a new id's
lookup was slower than in a column family of its own (docs/PERFORMANCE.md, *Accepting
a timer*). One write batch spans both column families,
atomically (the WAL). A table written with the index among the timers has it moved
when opened.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rocksdict import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DbClosedError,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
)

from futures.worker.fencing import owner_headers
from futures.worker.fired_keys import FIRED_RECORD_BYTES, pack_keys, unpack_keys
from futures.worker.table_read import keys_between, take_due
from futures.worker.table_write import (
    FIRED_PREFIX,
    INDEX_PREFIX,
    PROGRESS_KEY,
    TIMER_PREFIX,
    TOPIC_PROGRESS_PREFIX,
    fill,
)
from ktimers.producer import RecordHeaders
from ktimers.wire import due_prefix, split_timer_key, timer_key

log = logging.getLogger(__name__)

#: The id index's column family.
IDS = "ids"
#: Index entries moved per write when a table written with them among the timers is opened.
_MOVE_BATCH = 10_000

PENDING_KEY = b"m:pending"
OFFSET_KEY = b"m:offset"
EPOCHS_KEY = b"m:epochs"
STALE_KEY = b"m:stale"
CURRENT_KEY = b"m:current"
#: ``m:applying:`` + topic: the last offset of that ingress topic a write's step reaches, written
#: first in the write (before its timers), so a table that holds its timers knows it may.
APPLYING_PREFIX = b"m:applying:"

_I64 = struct.Struct(">q")
_PROGRESS = struct.Struct(">qq")
_U64 = struct.Struct(">Q")
_U64_MAX = 2**64 - 1

#: Where the id starts in a timer key (after TIMER_PREFIX and the 8-byte due time).
_TIMER_ID_AT = len(TIMER_PREFIX) + _U64.size

NO_WATERMARK = -1
NO_OFFSET = -1

#: A changelog record: (key, value), value None meaning delete.
Record = tuple[bytes, bytes | None]


def table_key(due_ms: int, timer_id: str) -> bytes:
    return TIMER_PREFIX + timer_key(due_ms, timer_id)


def due_of_key(key: bytes) -> int:
    """The due time (epoch ms) in a timer's table key."""
    return int(_U64.unpack_from(key, len(TIMER_PREFIX))[0])


def _epochs_value(met: int | None, written: int | None) -> bytes:
    return _PROGRESS.pack(-1 if met is None else met, -1 if written is None else written)


def id_of_key(key: bytes) -> str:
    """The timer id in a timer's table key."""
    return key[_TIMER_ID_AT:].decode("utf-8", "replace")


def progress_record(watermark: int, request_offset: int) -> Record:
    """The record that closes a changelog write: watermark (epoch s) and last applied request offset."""
    return PROGRESS_KEY, _PROGRESS.pack(watermark, request_offset)


def topic_progress_record(topic: str, offset: int) -> Record:
    """Last applied offset of ``topic``, an ingress topic other than `timer-request`."""
    return TOPIC_PROGRESS_PREFIX + topic.encode(), _I64.pack(offset)


def applying_record(topic: str, offset: int) -> Record:
    """A write applies requests of ``topic`` (any ingress topic) up to ``offset`` (see
    :meth:`PartitionTimers.may_hold`)."""
    return APPLYING_PREFIX + topic.encode(), _I64.pack(offset)


@dataclass(frozen=True)
class TableSizes:
    """What one partition's table takes, as RocksDB counts it (bytes)."""

    #: SST files the table reads from (on disk, compressed).
    sst: int
    #: Memtables: writes not yet flushed to SST files.
    memtables: int
    #: Compaction owed: what RocksDB estimates it must rewrite to bring every level within its size.
    compaction_pending: int


@dataclass(frozen=True)
class Unswept:
    """What the sweep's write takes along for timers an ``f`` record lists."""

    #: The listed timers the table no longer holds: each gets its own tombstone, before the
    #: record's. A timer put again under its key since it fired is pending, and keeps its put.
    gone: list[bytes]
    #: The id index entries those timers left (a live firing does not delete them, see
    #: :meth:`PartitionTimers.apply`): not an entry a newer version of the id put.
    stale_index: list[bytes]


@dataclass(frozen=True)
class DueTimer:
    key: bytes
    due_ms: int
    timer_id: str
    value: bytes


#: One block cache for every partition table of the process (bytes).
BLOCK_CACHE_BYTES = 32 * 1024 * 1024
_BLOCK_CACHE = Cache(BLOCK_CACHE_BYTES)
#: The memtables of every partition table of the process together (bytes): past it, the table
#: written to flushes. RocksDB's memory then does not grow with the number of partitions a
#: worker holds (after a failover, all of them).
MEMTABLES_BYTES = 64 * 1024 * 1024
#: How long a write waits at most for memtables being flushed (s): a disk slower than that is
#: failing, and the write goes ahead rather than stop the worker.
FLUSH_WAIT_S = 5.0
_FLUSH_POLL_S = 0.002


class MemtableCap:
    """One cap on the memtables of every partition table of the process.

    RocksDB's write buffer manager flushes the table written to once the memtables pass the cap,
    but it flushes in the background: behind a slow disk, the memtables waiting to be written
    would pile up on top of it. A write therefore waits, while the memtables are past the cap, for
    those being flushed (:meth:`hold_writes`). The manager's own stall (``allow_stall``) is not
    used: it waits for memory to fall even when what is over the cap sits in the memtables of
    tables nobody writes to, and nothing then ever flushes them.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.manager = WriteBufferManager(max_bytes, False)
        # Weak: a table dropped without close() is still closed when collected.
        self._tables: weakref.WeakSet[PartitionTimers] = weakref.WeakSet()
        self._lock = threading.Lock()  # tables are opened on other threads
        #: Seconds writes have waited for flushes, in all.
        self.waited_s = 0.0

    def add(self, table: PartitionTimers) -> None:
        with self._lock:
            self._tables.add(table)

    def _flushing(self) -> bool:
        with self._lock:
            tables = list(self._tables)
        return any(table.flushing() for table in tables)

    def hold_writes(self) -> None:
        """Return once the memtables are within the cap, or none is waiting to be flushed."""
        if self.manager.get_usage() < self.max_bytes:
            return
        started = time.monotonic()
        while self.manager.get_usage() >= self.max_bytes and self._flushing():
            if time.monotonic() - started > FLUSH_WAIT_S:
                log.warning("memtables past their cap for %.0f s: a flush is stuck; writing", FLUSH_WAIT_S)
                break
            time.sleep(_FLUSH_POLL_S)
        self.waited_s += time.monotonic() - started


MEMTABLES = MemtableCap(MEMTABLES_BYTES)


class FoundIds:
    """One cap on the index entries that the partition tables of the process remember their
    lookups found, for their sweeps (:meth:`PartitionTimers.trust_listings`): bytes, each entry
    counted with its Python object and its slot in a set. A table whose note passes the cap
    forgets its own, and its sweep reads the entries of every timer it listed so far."""

    #: What an entry costs beside its key's bytes: the bytes object's header and a set slot.
    ENTRY_BYTES = 64

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0


FOUND_IDS = FoundIds(1024 * 1024)

#: Each partition table's memtables: WRITE_BUFFERS of WRITE_BUFFER_BYTES at most (bytes) for
#: the timers, of IDS_WRITE_BUFFER_BYTES for the id index, whose entries are a fifth of a
#: timer's size or less: the two flush about as often.
WRITE_BUFFER_BYTES = 8 * 1024 * 1024
IDS_WRITE_BUFFER_BYTES = 2 * 1024 * 1024
WRITE_BUFFERS = 2
#: Each memtable's bloom filter over whole keys, as a share of its size.
MEMTABLE_BLOOM_RATIO = 0.02
#: Level 0 files that start a compaction into the level below (RocksDB's default).
L0_COMPACTION_TRIGGER = 4


def _bounded(upper: bytes) -> ReadOptions:
    """Read options whose iterators stop before ``upper`` (keep them referenced while one reads:
    it finds the bound in them). Unbounded, an iterator past the last
    live key of its range walks every deleted key after it up to the next live one: once a burst
    is fired and swept, the id index's hundreds of thousands of tombstones, which no compaction
    clears while the table is idle (it writes too little to start one)."""
    opts = ReadOptions()
    opts.set_iterate_upper_bound(upper)
    return opts


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with ``prefix`` (whose last byte is not 0xff)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _options(*, index: bool) -> Options:
    """A column family's options: the timers', or the id index's (``index``), whose memtables
    are smaller and which alone has bloom filters."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # Memory stays flat however many timers are pending: small memtables,
    # data lives in SST files on disk.
    buffer_bytes = IDS_WRITE_BUFFER_BYTES if index else WRITE_BUFFER_BYTES
    opts.set_write_buffer_size(buffer_bytes)
    opts.set_max_write_buffer_number(WRITE_BUFFERS)
    opts.set_write_buffer_manager(MEMTABLES.manager)
    if index:
        # Nearly every id a request brings is new: its index lookup misses, and a miss searched
        # each memtable's skip list from the top. A bloom filter over whole keys answers most
        # of them; it takes MEMTABLE_BLOOM_RATIO of each memtable, inside the memtables' cap.
        opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
        opts.set_memtable_whole_key_filtering(True)
    # The level below L0 sized as L0 is when it compacts (RocksDB's tuning rule). Its
    # default, 256 MiB, suits 64 MiB memtables: with ours, every 32 MiB compacted out of L0
    # would be merged into up to 256 MiB of it, as the id index's keys are random and overlap
    # all of it: compaction, on the worker's other core, writes far less this way
    # (docs/PERFORMANCE.md#10-m-pending).
    opts.set_level_zero_file_num_compaction_trigger(L0_COMPACTION_TRIGGER)
    opts.set_max_bytes_for_level_base(buffer_bytes * L0_COMPACTION_TRIGGER)
    # Index and filter blocks grow with the data; by default RocksDB keeps them
    # all in memory. In the (bounded, shared) block cache instead, memory stays
    # flat at any number of pending timers. Ticks scan in key order, so a small
    # cache loses little; the OS page cache does the rest.
    table = BlockBasedOptions()
    table.set_block_cache(_BLOCK_CACHE)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    if index:
        # Every request looks its id up in the index (latest wins), and nearly every
        # id is new: a bloom filter answers "not here" without reading data blocks.
        # 10 bits a key: ~1 % false positives.
        table.set_bloom_filter(10, False)
        table.set_partition_filters(True)
    # Partitioned: an SST file's index and filter are many small blocks under a small
    # pinned top level, so a lookup loads a few KiB into the cache, not a whole
    # file's index and filter (MiBs at a million timers, evicted again at once by
    # the next file's: docs/PERFORMANCE.md#accepting-a-timer).
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_pin_top_level_index_and_filter(True)
    opts.set_block_based_table_factory(table)
    return opts


class PartitionTimers:
    """Pending timers of one ``timer-request`` partition, in their own RocksDB."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = Rdict(
            str(path), options=_options(index=False), column_families={IDS: _options(index=True)}
        )
        #: The id index, its column family. Write batches take its handle, asked for each
        #: write: a handle keeps the database open, even once closed.
        self._ids = self._db.get_column_family(IDS)
        MEMTABLES.add(self)
        self._move_index()
        progress = self._db.get(PROGRESS_KEY)
        self.watermark, self.request_offset = (
            _PROGRESS.unpack(progress) if progress is not None else (NO_WATERMARK, NO_OFFSET)
        )
        #: Last applied offset of each other ingress topic (absent: none applied yet).
        self.topic_offsets: dict[str, int] = dict(self._read_topic_offsets())
        #: Per ingress topic, the last offset a write reached, its progress landed or not (:meth:`may_hold`).
        self._applying: dict[str, int] = {
            key[len(APPLYING_PREFIX) :].decode(): int(_I64.unpack(value)[0])
            for key, value in self._scan(APPLYING_PREFIX)
        }
        self.pending = self._read_int(PENDING_KEY, _U64, 0)
        offset = self._read_int(OFFSET_KEY, _I64, -1)
        self.persisted_offset: int | None = None if offset < 0 else offset
        current = self._read_int(CURRENT_KEY, _I64, -1)
        #: When the table last held every record of its changelog partition (wall-clock epoch ms;
        #: None: never known).
        self.current_ms: int | None = None if current < 0 else current
        # The low mark (see the module docstring), found by a scan when not known: on
        # opening, and after a changelog replay.
        self._low_ms: int | None = None
        self._low_known = False
        #: The sequence number of the next ``f`` record: past every one the table holds.
        self._fired_seq = self._last_fired_seq() + 1
        met, written = self._read_epochs()
        #: The highest epoch of the owner records the table applied (:mod:`futures.worker.fencing`),
        #: None if none: where a replay from its offset starts fencing.
        self.owner_epoch: int | None = met
        #: The epoch this table's owner last wrote under (:meth:`own`), None if never.
        self.written_epoch: int | None = written
        #: The headers of every changelog record written for this table: its owner's epoch
        #: (None until :meth:`own`: records without it are always applied).
        self.owner_headers: RecordHeaders | None = None
        #: The first ``f`` record whose timers' index entries the sweep deletes unread (None:
        #: none), and the entries a lookup found since (:meth:`trust_listings`).
        self._trusted_from: int | None = None
        self._found: set[bytes] = set()
        self._found_bytes = 0
        #: Where this partition's next changelog record lands while its owner is the only writer
        #: (None: right after :attr:`persisted_offset`); and what a fenced owner wrote meanwhile:
        #: changelog ranges still to read, keys to restate (:mod:`futures.worker.restate`).
        self._next_offset: int | None = None
        self.unread: list[tuple[int, int]] = []
        self.restate: set[bytes] = set()

    def _move_index(self) -> None:
        """Move the id index of a table written with it among the timers to its column family."""
        moved = 0
        ids_cf = self._db.get_column_family_handle(IDS)
        batch = WriteBatch(raw_mode=True)
        for key, value in self._scan(INDEX_PREFIX):
            batch.put(key, value, ids_cf)
            moved += 1
            if moved % _MOVE_BATCH == 0:
                self._db.write(batch)
                batch = WriteBatch(raw_mode=True)
        if moved:
            batch.delete_range(INDEX_PREFIX, _prefix_end(INDEX_PREFIX))
            self._db.write(batch)
            log.info("%s: moved %d id index entries to their column family", self.path, moved)

    def _last_fired_seq(self) -> int:
        it = self._db.iter()
        it.seek_for_prev(FIRED_PREFIX + b"\xff" * _U64.size)
        if not it.valid() or not bytes(it.key()).startswith(FIRED_PREFIX):
            return -1
        return int(_U64.unpack_from(bytes(it.key()), len(FIRED_PREFIX))[0])

    def _read_epochs(self) -> tuple[int | None, int | None]:
        raw = self._db.get(EPOCHS_KEY)
        if raw is None:
            return None, None
        met, written = _PROGRESS.unpack(raw)
        return (None if met < 0 else met), (None if written < 0 else written)

    def own(self, epoch: int) -> None:
        """This worker writes the table's changelog under ``epoch`` from now on: its owner record
        (:func:`~futures.worker.fencing.owner_record`) was written. The epochs met are not raised:
        they are those of the owner records up to the changelog offset the table has applied, and
        the recovery that follows reads this one."""
        self.written_epoch = epoch
        self.owner_headers = owner_headers(epoch)
        self._db.put(EPOCHS_KEY, _epochs_value(self.owner_epoch, self.written_epoch))

    @property
    def stale(self) -> bool:
        """Marked for a rebuild from the changelog (:meth:`mark_stale`)."""
        return self._db.get(STALE_KEY) is not None

    def mark_stale(self) -> None:
        """The table is not what its changelog restores: whoever opens it next rebuilds it."""
        self._db.put(STALE_KEY, b"")
        self._db.flush()

    def _read_int(self, key: bytes, codec: struct.Struct, default: int) -> int:
        raw = self._db.get(key)
        return default if raw is None else int(codec.unpack(raw)[0])

    def _read_topic_offsets(self) -> Iterator[tuple[str, int]]:
        for key, value in self._scan(TOPIC_PROGRESS_PREFIX):
            yield key[len(TOPIC_PROGRESS_PREFIX) :].decode(), int(_I64.unpack(value)[0])

    def may_hold(self, topic: str, offset: int) -> bool:
        """Whether the timers of the record at ``offset`` of ``topic`` may be in the table already:
        a write that applied it reached the table (or the changelog it was rebuilt from) but
        its progress record did not, so the record is read again. Its ids must then be looked
        up, also those its producer drew (``kt-ids: new``): the timers are there, and counting
        them again would make the pending count wrong for good."""
        return offset <= self._applying.get(topic, NO_OFFSET)

    def index_entries(self) -> Iterator[tuple[bytes, bytes]]:
        """The id index: (``i`` + id, the due time's 8 bytes), in key order."""
        return self._scan(INDEX_PREFIX, self._ids)

    def _scan(self, prefix: bytes, db: Rdict | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every key that starts with ``prefix``, in key order, in the timers'
        column family or ``db``."""
        bound = _bounded(_prefix_end(prefix))  # held: the iterator reads its bound from it
        it = (self._db if db is None else db).iter(bound)
        it.seek(prefix)
        while it.valid():
            yield bytes(it.key()), bytes(it.value())
            it.next()

    def topic_offset(self, topic: str) -> int:
        """Last applied offset of ingress topic ``topic`` (not `timer-request`: see ``request_offset``)."""
        return self.topic_offsets.get(topic, NO_OFFSET)

    # -- the low mark ----------------------------------------------------------

    @property
    def low_ms(self) -> int | None:
        """Due time (epoch ms) of the earliest pending timer at or below the watermark, if any."""
        if not self._low_known:
            self._low_ms = self._first_due(0, self._watermark_ms())
            self._low_known = True
        return self._low_ms

    def _watermark_ms(self) -> int:
        return self.watermark * 1000 if self.watermark >= 0 else -1

    def _first_due(self, from_ms: int, to_ms: int) -> int | None:
        """Due time of the earliest pending timer with ``from_ms <= due_ms <= to_ms``, if any."""
        if to_ms < from_ms:
            return None
        bound = _bounded(TIMER_PREFIX + due_prefix(to_ms + 1))  # held while the iterator reads
        it = self._db.iter(bound)
        it.seek(TIMER_PREFIX + due_prefix(max(from_ms, 0)))
        return due_of_key(bytes(it.key())) if it.valid() else None

    def scanned(self, to_ms: int, kept_ms: int | None) -> None:
        """A scan fired every timer due by ``to_ms`` (epoch ms) but those kept for a retry, the
        earliest of them due at ``kept_ms``: what is left at or below the watermark sets the low mark."""
        low = self.low_ms
        if low is None or low > to_ms:
            if kept_ms is not None and (low is None or kept_ms < low):
                self._low_ms = kept_ms
            return
        rest = self._first_due(to_ms + 1, self._watermark_ms())
        self._low_ms = min((d for d in (kept_ms, rest) if d is not None), default=None)

    def _scan_start_ms(self) -> int:
        """Where a scan for due timers starts (epoch ms): the low mark, else past the watermark."""
        low = self.low_ms
        return low if low is not None else self._watermark_ms() + 1

    # -- reads ---------------------------------------------------------------

    def due_of(self, timer_id: str) -> int | None:
        """Due time (epoch ms) of the pending timer with this id, if any."""
        return self.due_of_id(timer_id.encode())

    def due_of_id(self, timer_id: bytes) -> int | None:
        """:meth:`due_of` by the id's UTF-8 bytes (ingest has them already); as :meth:`dues_of_ids`,
        an entry counts only while its timer is in the table."""
        index_key = INDEX_PREFIX + timer_id
        raw = self._ids.get(index_key)
        if raw is None:
            return None
        self._note_found([index_key])
        if self._db.get(TIMER_PREFIX + raw + timer_id) is None:
            return None
        return int(_U64.unpack(raw)[0])

    def dues_of_ids(self, timer_ids: list[bytes]) -> list[int | None]:
        """:meth:`due_of_id` of many ids (UTF-8 bytes) at once: one RocksDB MultiGet, which
        looks a batch of keys up file by file, for less CPU a key than one get each
        (docs/PERFORMANCE.md#accepting-a-timer).

        An index entry counts only while its timer is in the table: a fired timer's entry
        stays until the sweep takes its ``f`` record (see :meth:`apply`), so an entry found
        is checked against its timer, with a second MultiGet. Nearly every id a request
        brings is new and has no entry: that costs nothing more.
        """
        index_keys = [INDEX_PREFIX + i for i in timer_ids]
        raws: list[bytes | None] = self._ids.get(index_keys)  # type: ignore[arg-type, assignment]
        dues: list[int | None] = [None] * len(raws)
        found = [(n, raw) for n, raw in enumerate(raws) if raw is not None]
        if found:
            self._note_found([index_keys[n] for n, _ in found])
            keys = [TIMER_PREFIX + raw + timer_ids[n] for n, raw in found]
            timers: list[bytes | None] = self._db.get(keys)  # type: ignore[arg-type, assignment]
            unpack = _U64.unpack
            for (n, raw), timer in zip(found, timers, strict=True):
                if timer is not None:
                    dues[n] = int(unpack(raw)[0])
        return dues

    def get(self, due_ms: int, timer_id: str) -> bytes | None:
        return self.get_raw(table_key(due_ms, timer_id))

    def get_raw(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def due_items(
        self,
        limit_ms: int,
        max_count: int,
        after: bytes | None = None,
        from_ms: int = 0,
        max_bytes: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """Up to ``max_count`` pending timers with due_ms <= ``limit_ms``, earliest first, as
        (table key, ``StoredTimer`` bytes): the fire path's and precise windows' scan.

        The scan starts at the low mark, or past the watermark (earlier timers were
        fired and deleted), and so never walks the tombstones that firing leaves at
        the head of the key range. ``after``: resume past this table key (timers kept
        for a retry are not returned again). ``from_ms``: only timers due at or after
        it (epoch ms). ``max_bytes``: stop once the values read reach it (at least one is read).
        """
        start_ms = max(self._scan_start_ms(), from_ms)
        start = TIMER_PREFIX + due_prefix(start_ms)
        if after is not None and after >= start:
            start = after + b"\x00"  # the smallest key greater than ``after``
        if max_count <= 0:
            return []
        # Bounded in RocksDB, which then stops at the limit (past it: later timers and the
        # index), and read by its item iterator, taken off it in compiled code.
        bounded = _bounded(TIMER_PREFIX + due_prefix(limit_ms + 1))
        items: Iterator[tuple[bytes, bytes]] = self._db.items(from_key=start, read_opt=bounded)  # type: ignore[assignment]
        return take_due(items, max_count, max_bytes)

    def iter_pending(self) -> Iterator[DueTimer]:
        """Every pending timer in due order (for tools and tests; a full scan)."""
        for key, value in self._scan(TIMER_PREFIX):
            due_ms, timer_id = split_timer_key(key[1:])
            yield DueTimer(key, due_ms, timer_id, value)

    def iter_range(
        self, from_ms: int, to_ms: int, after_key: bytes | None = None, limit: int = 100
    ) -> Iterator[DueTimer]:
        """Up to ``limit`` pending timers with ``from_ms <= due_ms < to_ms`` (epoch ms), earliest first.

        A bounded range scan for listings and paging: it seeks to the later of
        ``from_ms`` and the low mark or the watermark (before them, only the
        tombstones of fired timers lie) or just past ``after_key`` (the last
        key of the previous page), and stops at ``to_ms`` or after ``limit`` timers.
        """
        start = TIMER_PREFIX + due_prefix(max(from_ms, self._scan_start_ms(), 0))
        if after_key is not None and after_key >= start:
            start = after_key + b"\x00"  # the smallest key greater than ``after_key``
        bound = _bounded(TIMER_PREFIX + due_prefix(min(to_ms, _U64_MAX)))  # held while it reads
        it = self._db.iter(bound)
        it.seek(start)
        found = 0
        while it.valid() and found < limit:
            key = bytes(it.key())
            due_ms, timer_id = split_timer_key(key[1:])
            yield DueTimer(key, due_ms, timer_id, bytes(it.value()))
            found += 1
            it.next()

    def fired_listings(self, max_keys: int) -> list[tuple[bytes, list[bytes]]]:
        """The oldest ``f`` records, until they list ``max_keys`` keys (at least one record, if
        any): each record's key, with the timer keys it lists."""
        listed: list[tuple[bytes, list[bytes]]] = []
        for fired_key, value in self._scan(FIRED_PREFIX):
            listing = unpack_keys(value)
            listed.append((fired_key, listing))
            max_keys -= len(listing)
            if max_keys <= 0:
                break
        if not listed:
            self._forget_found()  # they mattered only to the timers listed before they were found
        return listed

    def unswept(self, listed: list[bytes], fired_key: bytes) -> Unswept:
        """What the sweep's write takes along for the timer keys ``listed`` (the ``f`` record
        ``fired_key``'s, or part of them): see :class:`Unswept`. The timers are read by a scan
        of their range (:meth:`_held`), their index entries with one MultiGet; where the table
        knows them unread (:meth:`trust_listings`), only those of the ids put again since."""
        trusted, found = self._trusts(fired_key), self._found
        if trusted:
            # Only an id put again since can have a timer under a listed key, or a newer entry.
            index_keys = [INDEX_PREFIX + key[_TIMER_ID_AT:] for key in listed]
            if not found or found.isdisjoint(index_keys):
                return Unswept(listed, index_keys)
            again = [key for key, index_key in zip(listed, index_keys, strict=True) if index_key in found]
            present: list[bytes | None] = self._db.get(again)  # type: ignore[arg-type, assignment]
            held = {key for key, value in zip(again, present, strict=True) if value is not None}
        else:
            held = self._held(listed)
        gone = [key for key in listed if key not in held] if held else listed
        index_keys = [INDEX_PREFIX + key[_TIMER_ID_AT:] for key in gone]
        read = [index_key for index_key in index_keys if index_key in found] if trusted else index_keys
        raws: list[bytes | None] = self._ids.get(read)  # type: ignore[arg-type, assignment]
        points = dict(zip(read, raws, strict=True))
        stale = [
            index_key
            for key, index_key in zip(gone, index_keys, strict=True)
            if points.get(index_key, key[1:_TIMER_ID_AT]) == key[1:_TIMER_ID_AT]
        ]
        return Unswept(gone, stale)

    def trust_listings(self) -> None:
        """Let the sweep delete the index entries of the timers this table lists from now on
        without reading them, but for the ids a lookup found an entry of since.

        For a firing that scans, sends and deletes its timers under the engine lock (second
        mode): a timer it lists was in the table until its ``f`` record, so its id's entry
        pointed at it, and still does unless the id was put again since. A live write puts
        only timers whose ids it looked up first (:meth:`dues_of_ids`, which notes each entry
        it finds: such an id was put before) or a series' next occurrence
        (:meth:`note_put_again`). Not for precise mode, whose windows send timers before
        their ``f`` records: an id put again in between, then forgotten (:class:`FoundIds`),
        would lose its new entry. A replay of the changelog ends the trust: it puts without
        looking up.
        """
        if self._trusted_from is None:
            self._trusted_from = self._fired_seq

    def end_trust(self) -> None:
        """The sweep reads the index entries of every timer listed so far (until
        :meth:`trust_listings` again): a sweep of a record may start again over timers whose
        entries it deleted, where an id put again since has an entry no lookup noted."""
        self._trusted_from = None
        self._forget_found()

    def note_put_again(self, timer_id: str) -> None:
        """``timer_id`` is put again without a lookup (a series' next occurrence): its index
        entry is read before the sweep deletes it."""
        self._note_found([INDEX_PREFIX + timer_id.encode()])

    def note_put_unlooked(self, timer_ids: list[bytes]) -> None:
        """The ids (UTF-8 bytes) are put without a lookup (``kt-ids: new``): as
        :meth:`note_put_again`, should one be an id fired and not swept yet."""
        if self._trusted_from is not None:
            self._note_found([INDEX_PREFIX + timer_id for timer_id in timer_ids])

    def _trusts(self, fired_key: bytes) -> bool:
        trusted_from = self._trusted_from
        return trusted_from is not None and _U64.unpack_from(fired_key, len(FIRED_PREFIX))[0] >= trusted_from

    def _note_found(self, index_keys: list[bytes]) -> None:
        if self._trusted_from is None:
            return  # the sweep reads every entry
        found = self._found
        new = [key for key in index_keys if key not in found]  # an id found again costs nothing more
        found.update(new)
        added = sum(map(len, new)) + FoundIds.ENTRY_BYTES * len(new)
        self._found_bytes += added
        FOUND_IDS.used += added
        if FOUND_IDS.used > FOUND_IDS.cap:
            # Too many to keep: the entries of the timers listed so far are read, and the
            # sweep trusts the records written from now on.
            self._forget_found()
            self._trusted_from = self._fired_seq

    def _forget_found(self) -> None:
        self._found.clear()
        FOUND_IDS.used -= self._found_bytes
        self._found_bytes = 0

    def _held(self, keys: list[bytes]) -> set[bytes]:
        """Those of the timer ``keys`` the table holds.

        Read by one scan from the lowest key to the highest, not one lookup each: the keys a
        firing lists lie together in due order, and RocksDB steps over the deleted ones
        without a call into Python, for a fraction of a lookup each. The range may hold other
        timers: ones a firing left between those it fired (kept for a retry, accepted late, a
        precise window's not yet sent). Should it hold more of them than ``keys`` (timers
        kept for hours for a callback topic that fails), each key is looked up instead, so
        that reading costs at most about as much as there are keys.
        """
        if not keys:
            return set()
        live = keys_between(self._db, min(keys), max(keys), len(keys) + 1)
        if len(live) > len(keys):
            found: list[bytes | None] = self._db.get(keys)  # type: ignore[arg-type, assignment]
            return {key for key, value in zip(keys, found, strict=True) if value is not None}
        return set(live).intersection(keys) if live else set()

    # -- writes --------------------------------------------------------------

    def fired_records(self, keys: Sequence[bytes], max_bytes: int = FIRED_RECORD_BYTES) -> list[Record]:
        """The ``f`` records that delete the fired timers ``keys`` (see the module docstring), each
        of at most ``max_bytes`` of keys."""
        records: list[Record] = []
        for value in pack_keys(keys, max_bytes):
            records.append((FIRED_PREFIX + _U64.pack(self._fired_seq), value))
            self._fired_seq += 1
        return records

    def apply(
        self,
        records: Sequence[Record],
        offset: int | None,
        pending_delta: int | None = None,
        stale_index: Sequence[bytes] = (),
        *,
        progress_on_disk: bool = True,
        owner_epoch: int | None = None,
        applied: dict[str, int] | None = None,
    ) -> None:
        """Apply changelog records in order, atomically, and remember ``offset``.

        ``pending_delta`` is the change in pending count when the caller knows it
        (the live path does); otherwise, as in changelog replay, each record is
        checked against the table. ``stale_index``: id index entries the write deletes
        too, which are no changelog records (the sweep's: :attr:`Unswept.stale_index`).
        ``progress_on_disk=False``: the progress record among ``records`` is still on its way to
        the changelog, so it moves the table in memory only; :meth:`progress_landed` writes it
        once it landed (:mod:`futures.worker.progress`). ``owner_epoch``: the highest owner epoch
        a replay met up to these records (:class:`~futures.worker.fencing.OwnerFence`).
        ``applied``: the ``m:applying:`` records among ``records`` (topic → offset), when the
        caller knows them (the live path does); otherwise they are looked for.
        The records become the batch's operations in compiled code
        (:func:`~futures.worker.table_write.fill`).
        """
        batch = WriteBatch(raw_mode=True)
        # A timer put at or below the watermark (accepted late) lowers the low mark.
        below = TIMER_PREFIX + due_prefix(self._watermark_ms() + 1)
        ids_cf = self._db.get_column_family_handle(IDS)
        delta, low, watermark, request_offset, topic_offsets, self._fired_seq = fill(
            batch, self._db, self._ids, ids_cf, records, pending_delta is None, below, self._low_ms,
            stale_index, self.topic_offset, self.watermark, self.request_offset, self._fired_seq,
        )  # fmt: skip
        if pending_delta is not None:
            delta = pending_delta
        pending = max(self.pending + delta, 0)
        batch.put(PENDING_KEY, _U64.pack(pending))
        applying = applied if applied is not None else _applying_in(records)
        for topic, applied_to in applying.items():
            batch.put(*applying_record(topic, applied_to))
        if progress_on_disk:
            batch.put(PROGRESS_KEY, _PROGRESS.pack(watermark, request_offset))
        for topic, topic_offset in topic_offsets.items():
            batch.put(topic_progress_record(topic, topic_offset)[0], _I64.pack(topic_offset))
        if offset is not None:
            batch.put(OFFSET_KEY, _I64.pack(offset))
        met = self.owner_epoch
        if owner_epoch is not None and (met is None or owner_epoch > met):
            met = owner_epoch
            batch.put(EPOCHS_KEY, _epochs_value(met, self.written_epoch))
        MEMTABLES.hold_writes()
        self._db.write(batch)
        self.owner_epoch = met
        self.pending, self.watermark, self.request_offset = pending, watermark, request_offset
        self.topic_offsets.update(topic_offsets)
        for topic, applied_to in applying.items():
            self._applying[topic] = max(self._applying.get(topic, NO_OFFSET), applied_to)
        if offset is not None:
            self.persisted_offset, self._next_offset = offset, None
        if pending_delta is None:
            # A replay: a timer kept below the watermark by its writer is put before the
            # progress that passed it, so the low mark is found anew when next needed. Its
            # puts were not looked up: the sweep reads the entries of what is listed so far.
            self._low_known = False
            self.end_trust()
        elif self._low_known:
            self._low_ms = low

    def sizes(self) -> TableSizes:
        """The table's size on disk and in memory, and the compaction it owes (safe from any thread)."""

        def read(name: str) -> int:
            return sum(int(cf.property_int_value(name) or 0) for cf in (self._db, self._ids))

        return TableSizes(
            sst=read("rocksdb.live-sst-files-size"),
            memtables=read("rocksdb.cur-size-all-mem-tables"),
            compaction_pending=read("rocksdb.estimate-pending-compaction-bytes"),
        )

    @property
    def next_offset(self) -> int | None:
        """Where the next record this table's owner writes lands, if nobody else writes first
        (None: not known)."""
        if self._next_offset is not None:
            return self._next_offset
        return None if self.persisted_offset is None else self.persisted_offset + 1

    def landed_beyond(self, first: int, offset: int) -> None:
        """The records written from ``first`` landed, and the last, expected at an offset before
        ``offset``, landed there: someone else wrote in between (:mod:`futures.worker.restate`)."""
        self.unread.append((first, offset))

    def progress_landed(self, record: Record, offset: int | None, landed_ms: int) -> None:
        """A progress record (:func:`progress_record`) applied in memory landed at changelog
        ``offset``, seen at ``landed_ms`` (wall-clock epoch ms): the table on disk records it, and
        that it held every record of the partition then (its owner is the one writer). Skipped once
        the table is closed (its partition went elsewhere: the changelog, which holds the record,
        is what the next owner reads). While another writer's records are still to read
        (:meth:`landed_beyond`), the offset on disk stays before them: a restart reads them again."""
        batch = WriteBatch(raw_mode=True)
        batch.put(*record)
        persist = offset is not None and not self.unread
        if persist:
            batch.put(OFFSET_KEY, _I64.pack(offset))
        batch.put(CURRENT_KEY, _I64.pack(landed_ms))
        try:
            self._db.write(batch)
        except DbClosedError:
            return
        if offset is not None:
            self._next_offset = offset + 1
            if persist:
                self.persisted_offset = offset
        self.current_ms = landed_ms

    def mark_current(self, now_ms: int) -> None:
        """The table holds every record of its changelog partition at ``now_ms`` (wall-clock epoch
        ms): its recovery is complete, or it is empty and about to be rebuilt from offset 0."""
        self._db.put(CURRENT_KEY, _I64.pack(now_ms))
        self.current_ms = now_ms

    def set_persisted_offset(self, offset: int) -> None:
        self._db.put(OFFSET_KEY, _I64.pack(offset))
        self.persisted_offset, self._next_offset = offset, None

    def flushing(self) -> bool:
        """Whether RocksDB has memtables of this table to flush (False once it is closed)."""
        try:
            name = "rocksdb.num-immutable-mem-table"
            return any(cf.property_int_value(name) for cf in (self._db, self._ids))
        except DbClosedError:
            return False

    def close(self) -> None:
        self._forget_found()
        # A column family keeps its database open: the closed database stands in for it.
        self._ids = self._db
        self._db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


def _applying_in(records: Sequence[Record]) -> dict[str, int]:
    """The ``m:applying:`` records among changelog ``records`` (a replay's), the last of each topic."""
    found: dict[str, int] = {}
    for key, value in records:
        if key.startswith(APPLYING_PREFIX) and value is not None:
            found[key[len(APPLYING_PREFIX) :].decode()] = int(_I64.unpack(value)[0])
    return found
