"""Owner epochs: what a revoked owner writes late changes no restored table.

A worker that loses a partition may still be writing to its changelog for a while: a step
under way when the revocation's settle gave up, a process paused past its session timeout,
a produce request still on the wire. Kafka appends those records after the ones the new
owner writes, and a replay would apply them on top: a late put brings a fired timer back, a
late progress record skips requests the new owner never applied.

So every owner writes under an **epoch**, the consumer group generation in which it was
assigned the partition (Kafka raises it at every rebalance, so a later owner's is higher):

* when a partition is assigned, the worker first writes an **owner record**,
  ``m:owner:`` + epoch (8 bytes, big-endian), once its own earlier writes have landed and
  before the table's recovery reads the changelog to its end;
* every changelog record it writes afterwards carries the epoch in its ``kt-owner`` header;
* a replay (:class:`OwnerFence`) keeps the highest epoch of the owner records it has met, and
  skips a record of a lower epoch: one written after a newer owner had started.

Owner records have a key each, so compaction keeps every one of them (one per partition and
assignment: a few bytes each), and with them where each owner started. A record without the
header was written by a worker that did not write epochs, and is always applied.

A worker whose own late writes were fenced has applied them to its local table already: its
table is not what the changelog restores. It notices when its recovery meets one of them
(:attr:`OwnerFence.diverged`), and its table is rebuilt from the changelog.

Compaction keeps each key's latest record, fenced or not: the owner writes again the keys of the
fenced records it finds (:mod:`futures.worker.restate`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from ktimers.producer import RecordHeaders

#: The key prefix of owner records; the epoch follows (8 bytes, big-endian).
OWNER_PREFIX = b"m:owner:"
#: The header that carries the writer's epoch on every other changelog record (ASCII digits).
OWNER_HEADER = "kt-owner"

_U64 = struct.Struct(">Q")

#: A changelog record's key and value, as written.
Record = tuple[bytes, bytes | None]


def owner_record(epoch: int) -> Record:
    """The record that opens ``epoch``'s writes to a partition's changelog."""
    return OWNER_PREFIX + _U64.pack(epoch), _U64.pack(epoch)


def owner_headers(epoch: int) -> RecordHeaders:
    """The headers of every record written under ``epoch`` (one list, shared by them all)."""
    return [(OWNER_HEADER, str(epoch).encode())]


def owner_epoch(key: bytes) -> int | None:
    """The epoch an owner record opens; None for any other key."""
    if key.startswith(OWNER_PREFIX) and len(key) == len(OWNER_PREFIX) + _U64.size:
        return int(_U64.unpack_from(key, len(OWNER_PREFIX))[0])
    return None


def header_epoch(headers: Iterable[tuple[str, bytes | str | None]] | None) -> int | None:
    """The epoch in a record's ``kt-owner`` header; None without one (or one that is not a number)."""
    for name, value in headers or ():
        if name == OWNER_HEADER and value is not None:
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
            return int(text) if text.isdigit() else None
    return None


class OwnerFence:
    """A replay's view of one partition's owners: which records to apply, in changelog order.

    ``epoch``: the highest epoch the table met so far (its recovery goes on from there).
    ``written``: the epoch the table's own owner last wrote under, if it wrote any: a record of
    that epoch that the fence skips is one this table applied live (:attr:`diverged`).
    """

    def __init__(self, epoch: int | None = None, written: int | None = None) -> None:
        self.epoch = epoch
        self._written = written
        #: Records skipped: written by an owner after a newer one started.
        self.fenced = 0
        #: The table applied, live, a record that the changelog's replay skips.
        self.diverged = False

    def admit(self, key: bytes, headers: Iterable[tuple[str, bytes | str | None]] | None) -> bool:
        """Whether a replay applies the record (``key``, ``headers``) read next from the changelog."""
        opened = owner_epoch(key)
        if opened is not None:
            if self.epoch is None or opened > self.epoch:
                self.epoch = opened
            return True
        epoch = header_epoch(headers)
        if epoch is None or self.epoch is None or epoch >= self.epoch:
            return True
        self.fenced += 1
        if epoch == self._written:
            self.diverged = True
        return False


def missed_a_generation(written: int | None, generation: int) -> bool:
    """Whether a table this worker kept open through the rebalance into ``generation`` was last
    written under an epoch before the one just past: the group went through a generation without
    this worker (its session expired while it was paused), in which another owner may have written.
    Its own late writes may have landed after that owner's and moved its offset past them, where
    its recovery would never read them: such a table is rebuilt. (A worker in the group takes part
    in every generation, and writes each one's owner records.)"""
    return written is not None and written < generation - 1
