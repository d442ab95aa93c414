"""Keys a fenced owner wrote late, written again by their partition's owner.

The owner fence (:mod:`futures.worker.fencing`) makes a replay skip what a revoked owner wrote
after a newer one started. Compaction knows nothing of that fence: it keeps each key's latest
record. Where a fenced record is the latest of a key the owner also wrote (``m:progress``; a
timer's put that both read from the same request; an ``f`` record's sequence number), compaction
would drop the owner's record and keep the fenced one, and a restore would then have neither.

So the owner **restates** such keys: it writes each one again, after the fenced record, as its
table holds it — the value, or a tombstone where the table holds none — and the owner's record is
the latest again. Restated records change nothing in a table that replays them: they are what it
holds already. Two paths find the fenced records:

* **Live**, by offsets. Between two progress records of a partition, its owner is the only
  writer it knows of, and counts what it writes: a progress record that lands further than that
  count says someone else wrote in between (:meth:`~futures.worker.progress.InFlight.take_landed`).
  The owner reads that range back (the gap reader, :mod:`futures.worker.gaps`), and restates the
  keys of the fenced records there in its next write. The table on disk keeps its offset before
  the range until then, so a restart reads the range again.
* **At recovery**: the fenced records a recovery skips are restated by the first write after it.

Both happen within seconds of the fenced record while ticks flow; the changelog's
``min.compaction.lag.ms`` keeps the records they protect from compaction meanwhile
(:mod:`futures.worker.changelog_topic`).

An ``f`` record lists timers to delete where it stands in the log; written again later, it would
delete a timer put again since. Restated, it lists only the timers the table no longer holds.
"""

from __future__ import annotations

from collections.abc import Iterable

from futures.worker.fencing import OwnerFence, owner_epoch
from futures.worker.fired_keys import pack_keys, unpack_keys
from futures.worker.gaps import GapReader
from futures.worker.table import FIRED_PREFIX, PROGRESS_KEY, PartitionTimers, Record


def replayed(
    fence: OwnerFence,
    table: PartitionTimers,
    key: bytes,
    headers: Iterable[tuple[str, bytes | str | None]] | None,
) -> bool:
    """Whether a recovery applies the record (``key``, ``headers``) read next into ``table``; a
    record ``fence`` skips has its key restated by the first write after the recovery."""
    if fence.admit(key, headers):
        return True
    table.restate.add(key)
    return False


async def fenced_keys(
    reader: GapReader, topic: str, partition: int, start: int, end: int, epoch: int
) -> list[bytes]:
    """The keys of the records of ``topic[partition]`` from ``start`` to ``end - 1`` that an owner
    of an epoch before ``epoch`` wrote (records of ``epoch`` and later are never restated: a newer
    owner's are its own to keep)."""
    fence = OwnerFence(epoch)
    found: list[bytes] = []
    for record in await reader.read(topic, partition, start, end):
        key = record.key
        # An owner record read here opens no epoch for this owner: it keeps its own.
        if key is None or owner_epoch(key) is not None:
            continue
        if not fence.admit(key, record.headers):
            found.append(key)
    return found


def restatement(table: PartitionTimers, keys: Iterable[bytes]) -> list[Record]:
    """The records that write ``keys`` again as ``table`` holds them. ``m:progress`` is left out:
    every write ends with one."""
    records: list[Record] = []
    for key in dict.fromkeys(keys):
        if key == PROGRESS_KEY:
            continue
        value = table.get_raw(key)
        if value is not None and key.startswith(FIRED_PREFIX):
            gone = [listed for listed in unpack_keys(value) if table.get_raw(listed) is None]
            value = next(iter(pack_keys(gone, len(value) + 1)), None) if gone else None
        records.append((key, value))
    return records
