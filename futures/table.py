"""The timer table of one partition: pending timers in RocksDB, ordered by due time.

Keys (bytes, compared bytewise by RocksDB):

=====================  ==========================  ======================
key                    value                       in the changelog?
=====================  ==========================  ======================
``t`` + due_ms(8) + id  ``StoredTimer``             yes (tombstone = fired/cancelled)
``m:progress``          watermark second (8) and    yes
                       last applied request
                       offset (8), signed
``i`` + id              due_ms(8)                   no: derived index for cancel/replace
``m:pending``           count (8)                   no: derived
``m:offset``            changelog offset (8)        no: how far the changelog is applied
=====================  ==========================  ======================

The progress record closes every changelog write. Its request offset makes
applying `timer-request` idempotent: records at or below it were applied
already, and are skipped when a restarted or new owner reads them again from
an older committed consumer offset — otherwise a re-read request for a timer
that has fired would fire it again.

Because the due time leads the key, "every timer due by second s" is one
forward range scan, and scheduling k timers into one second is k puts.
Every mutation — live or replayed from the changelog — goes through
:meth:`PartitionTimers.apply`, so a table rebuilt from its changelog is the
table that wrote it.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

from ktimers.wire import due_prefix, split_timer_key, timer_key

TIMER_PREFIX = b"t"
INDEX_PREFIX = b"i"
PROGRESS_KEY = b"m:progress"
PENDING_KEY = b"m:pending"
OFFSET_KEY = b"m:offset"

_I64 = struct.Struct(">q")
_PROGRESS = struct.Struct(">qq")
_U64 = struct.Struct(">Q")

NO_WATERMARK = -1
NO_OFFSET = -1

#: A changelog record: (key, value), value None meaning delete.
Record = tuple[bytes, bytes | None]


def table_key(due_ms: int, timer_id: str) -> bytes:
    return TIMER_PREFIX + timer_key(due_ms, timer_id)


def progress_record(watermark: int, request_offset: int) -> Record:
    """The record that closes a changelog write: watermark (epoch s) and last applied request offset."""
    return PROGRESS_KEY, _PROGRESS.pack(watermark, request_offset)


@dataclass(frozen=True)
class DueTimer:
    key: bytes
    due_ms: int
    timer_id: str
    value: bytes


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # Memory stays flat however many timers are pending: small memtables,
    # data lives in SST files on disk.
    opts.set_write_buffer_size(16 * 1024 * 1024)
    opts.set_max_write_buffer_number(2)
    return opts


class PartitionTimers:
    """Pending timers of one ``timer-request`` partition, in their own RocksDB."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = Rdict(str(path), options=_options())
        progress = self._db.get(PROGRESS_KEY)
        self.watermark, self.request_offset = (
            _PROGRESS.unpack(progress) if progress is not None else (NO_WATERMARK, NO_OFFSET)
        )
        self.pending = self._read_int(PENDING_KEY, _U64, 0)
        offset = self._read_int(OFFSET_KEY, _I64, -1)
        self.persisted_offset: int | None = None if offset < 0 else offset

    def _read_int(self, key: bytes, codec: struct.Struct, default: int) -> int:
        raw = self._db.get(key)
        return default if raw is None else int(codec.unpack(raw)[0])

    # -- reads ---------------------------------------------------------------

    def due_of(self, timer_id: str) -> int | None:
        """Due time (epoch ms) of the pending timer with this id, if any."""
        raw = self._db.get(INDEX_PREFIX + timer_id.encode())
        return None if raw is None else int(_U64.unpack(raw)[0])

    def get(self, due_ms: int, timer_id: str) -> bytes | None:
        return self.get_raw(table_key(due_ms, timer_id))

    def get_raw(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def due_by(self, limit_ms: int, max_count: int, after: bytes | None = None) -> list[DueTimer]:
        """Up to ``max_count`` pending timers with due_ms <= ``limit_ms``, earliest first.

        Every pending timer is due after the watermark (earlier ones were fired
        and deleted), so the scan starts there and never walks the tombstones
        that firing leaves at the head of the key range. ``after``: resume past
        this table key (timers kept for a retry are not returned again).
        """
        start_ms = self.watermark * 1000 + 1 if self.watermark >= 0 else 0
        start = TIMER_PREFIX + due_prefix(start_ms)
        if after is not None and after >= start:
            start = after + b"\x00"  # the smallest key greater than ``after``
        stop = TIMER_PREFIX + due_prefix(limit_ms + 1)
        found: list[DueTimer] = []
        it = self._db.iter()
        it.seek(start)
        while it.valid() and len(found) < max_count:
            key = bytes(it.key())
            if key >= stop:
                break
            due_ms, timer_id = split_timer_key(key[1:])
            found.append(DueTimer(key, due_ms, timer_id, bytes(it.value())))
            it.next()
        return found

    def iter_pending(self) -> Iterator[DueTimer]:
        """Every pending timer in due order (for tools and tests; a full scan)."""
        it = self._db.iter()
        it.seek(TIMER_PREFIX)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(TIMER_PREFIX):
                break
            due_ms, timer_id = split_timer_key(key[1:])
            yield DueTimer(key, due_ms, timer_id, bytes(it.value()))
            it.next()

    # -- writes --------------------------------------------------------------

    def apply(self, records: Sequence[Record], offset: int | None, pending_delta: int | None = None) -> None:
        """Apply changelog records in order, atomically, and remember ``offset``.

        ``pending_delta`` is the change in pending count when the caller knows it
        (the live path does); otherwise, as in changelog replay, each record is
        checked against the table.
        """
        batch = WriteBatch(raw_mode=True)
        delta = 0
        watermark, request_offset = self.watermark, self.request_offset
        # Whether each timer key exists once the records so far are applied: the
        # batch is not readable before it is written, and a replay batch may put
        # and delete (or put twice) the same key.
        present: dict[bytes, bool] = {}
        for key, value in records:
            if key.startswith(TIMER_PREFIX):
                due_ms, timer_id = split_timer_key(key[1:])
                index_key = INDEX_PREFIX + timer_id.encode()
                if pending_delta is None:
                    existed = present.get(key)
                    if existed is None:
                        existed = self._db.get(key) is not None
                    delta += (value is not None) - existed
                    present[key] = value is not None
                if value is None:
                    batch.delete(key)
                    batch.delete(index_key)
                else:
                    batch.put(key, value)
                    batch.put(index_key, _U64.pack(due_ms))
            elif key == PROGRESS_KEY and value is not None:
                record_watermark, record_offset = _PROGRESS.unpack(value)
                watermark = max(watermark, record_watermark)
                request_offset = max(request_offset, record_offset)
        if pending_delta is not None:
            delta = pending_delta
        pending = max(self.pending + delta, 0)
        batch.put(PENDING_KEY, _U64.pack(pending))
        batch.put(PROGRESS_KEY, _PROGRESS.pack(watermark, request_offset))
        if offset is not None:
            batch.put(OFFSET_KEY, _I64.pack(offset))
        self._db.write(batch)
        self.pending, self.watermark, self.request_offset = pending, watermark, request_offset
        if offset is not None:
            self.persisted_offset = offset

    def set_persisted_offset(self, offset: int) -> None:
        self._db.put(OFFSET_KEY, _I64.pack(offset))
        self.persisted_offset = offset

    def close(self) -> None:
        self._db.close()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
