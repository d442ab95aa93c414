"""Where a write becomes durable: the changelog write that every change of the tables goes through.

Ingest, a firing and a precise window's settle each gather their changes per
partition in :class:`Changes` and hand them to :func:`commit`, which orders the
durable writes the same way for all of them:

1. the events and dead letters the change caused, and its changelog records
   (puts of accepted timers, tombstones of cancelled ones, then the ``f`` records
   listing the fired ones: :meth:`PartitionTimers.fired_records`), all delivered —
   the changelog records through the quiet producer, which reports only failures
   (:mod:`futures.worker.kafka`);
2. then, where the write applied records of other ingress topics
   (``TIMERS_INGRESS_TOPICS``), their progress records, delivered;
3. then each partition's progress record (watermark and last applied request
   offset), in a batch of its own, its offset reported: like those of step 2, it
   acknowledges the requests it covers, so a restart skips them only once
   everything they caused is written;
4. and the local RocksDB tables, through :meth:`PartitionTimers.apply`, as a
   replay of the changelog would, without waiting for the progress records: they
   land while the next step runs, and nothing more is written to their partitions
   until they have (:mod:`futures.worker.progress`).

Callbacks are delivered before their timers' tombstones are part of a write (the
firing confirms them first), and Faust commits consumed offsets only after the
step that applied them returns; so a crash anywhere loses nothing.

An ingest step produces its changelog records while it is still staging them
(:class:`Ahead`): the broker takes in the first ones while the rest are staged,
instead of all of them after. They are the same records in the same order, and
nothing else is: until the progress record follows them, they are what a step cut
short by a crash leaves, which its requests, read again, put right.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice, repeat

from futures.worker.context import EngineContext
from futures.worker.fencing import owner_headers, owner_record
from futures.worker.kafka import Deliveries
from futures.worker.restate import fenced_keys, restatement
from futures.worker.table import FIRED_RECORD_BYTES, Record, progress_record, topic_progress_record

log = logging.getLogger(__name__)


@dataclass
class Changes:
    """Changelog records and progress of one partition, not yet written."""

    records: list[Record] = field(default_factory=list)
    #: Table keys of fired timers (callbacks delivered or dead-lettered): deleted by ``f``
    #: records written after ``records``.
    fired: list[bytes] = field(default_factory=list)
    #: Id index entries the write deletes from the table, which are no changelog records: the
    #: sweep's (:attr:`~futures.worker.table.Unswept.stale_index`).
    stale_index: list[bytes] = field(default_factory=list)
    pending_delta: int = 0
    watermark: int | None = None  # new watermark (epoch s), when it moved
    request_offset: int | None = None  # last `timer-request` offset applied, when requests were
    # Last offset applied of each other ingress topic (TIMERS_INGRESS_TOPICS).
    topic_offsets: dict[str, int] = field(default_factory=dict)
    #: Per ingress topic, the last offset of the step this write is of: its ``m:applying:``
    #: record, first among ``records`` (:meth:`~futures.worker.table.PartitionTimers.may_hold`).
    applying: dict[str, int] = field(default_factory=dict)
    scheduled: int = 0  # timers accepted into the table, counted once the write is durable
    # Ids touched in this step → due ms (None = removed): later requests in the
    # same step must see earlier ones before anything reaches the table.
    overlay: dict[str, int | None] = field(default_factory=dict)
    # Precise mode: timers put into the table, for their window once the write is durable:
    # (id, due ms, table key, StoredTimer bytes).
    offers: list[tuple[str, int, bytes, bytes]] = field(default_factory=list)
    #: A timer already due was accepted: fire the partition once the step is written.
    late: bool = False

    def writes(self) -> bool:
        return bool(
            self.records
            or self.fired
            or self.stale_index
            or self.watermark is not None
            or self.request_offset is not None
            or self.topic_offsets
        )


async def _topic_progress(
    ctx: EngineContext, changes: dict[int, Changes], staged: dict[int, list[Record]]
) -> None:
    """Write the progress of the other ingress topics' records a write applied, once what they
    caused (their dead letters above all) is delivered, and before the closing progress record.

    Like that record, each acknowledges the records it covers: written with them, it could
    land while their dead letters are lost with the worker, and a restart would resume past
    them. Delivered before the closing record is produced, which must be in a batch of its own.
    """
    deliveries = Deliveries()
    for partition, part in changes.items():
        if part.topic_offsets:
            progress = [topic_progress_record(*p) for p in part.topic_offsets.items()]
            staged[partition] += progress
            headers = ctx.tables(partition).owner_headers
            ctx.writer.produce_many(ctx.config.changelog_topic, partition, progress, deliveries, headers)
    if deliveries.quiet:
        await ctx.writer.delivered(deliveries)
        deliveries.raise_first("changelog progress")


@dataclass
class Ahead:
    """The changelog records of a write produced while it is still being staged: how many of
    each partition's :attr:`Changes.records`, the sweep's tombstones, and their delivery reports."""

    deliveries: Deliveries = field(default_factory=Deliveries)
    counts: dict[int, int] = field(default_factory=dict)
    #: The sweep's tombstones produced, per partition.
    tombstoned: dict[int, int] = field(default_factory=dict)

    def produce(self, ctx: EngineContext, changes: Mapping[int, Changes]) -> None:
        """Produce the records staged in ``changes`` since the last call."""
        counts, progress = self.counts, ctx.progress
        for partition, part in changes.items():
            done = counts.get(partition, 0)
            if len(part.records) > done and not progress.busy(partition):
                records = islice(part.records, done, None)
                headers = ctx.tables(partition).owner_headers
                ctx.writer.produce_many(
                    ctx.config.changelog_topic, partition, records, self.deliveries, headers
                )
                counts[partition] = len(part.records)

    def tombstones(self, ctx: EngineContext, partition: int, keys: list[bytes]) -> None:
        """Produce the tombstones of timers the table no longer holds (the sweep's): for the
        changelog only, as they change nothing in the table. Before any of the write's records."""
        if self.counts.get(partition):
            raise ValueError("tombstones go before a write's records")
        self.tombstoned[partition] = self.tombstoned.get(partition, 0) + len(keys)
        ctx.writer.produce_many(
            ctx.config.changelog_topic,
            partition,
            zip(keys, repeat(None)),
            self.deliveries,
            ctx.tables(partition).owner_headers,
        )


async def _restate(ctx: EngineContext, partitions: list[int]) -> dict[int, int]:
    """Write again the keys a fenced owner wrote in ``partitions``, as their tables hold them
    (:mod:`futures.worker.restate`), before the closing progress records; how many records each
    partition got."""
    reader, changelog = ctx.reader, ctx.config.changelog_topic
    written: dict[int, int] = {}
    deliveries = Deliveries()
    for partition in partitions:
        table = ctx.tables(partition)
        if table.unread and reader is not None and table.written_epoch is not None:
            for start, end in table.unread:
                table.restate.update(
                    await fenced_keys(reader, changelog, partition, start, end, table.written_epoch)
                )
        table.unread.clear()
        if table.restate:
            keys = len(table.restate)
            records = restatement(table, table.restate)
            table.restate.clear()
            ctx.writer.produce_many(changelog, partition, records, deliveries, table.owner_headers)
            written[partition] = len(records)
            ctx.metrics.restated.inc(keys)
            log.info("partition %d: %d changelog keys a fenced owner wrote, written again", partition, keys)
    if deliveries.quiet:
        await ctx.writer.delivered(deliveries)
        deliveries.raise_first("changelog restatement")
    return written


async def commit(ctx: EngineContext, changes: dict[int, Changes], *, ahead: Ahead | None = None) -> None:
    """Write ``changes`` to the changelog, wait for them, then apply them to the local tables;
    their progress records land meanwhile (:mod:`futures.worker.progress`).

    ``ahead``: what of the write is produced already (an ingest step's records, the sweep's
    tombstones).

    On the embedded broker, the progress record in a batch of its own also keeps Faust's
    table recovery exact: Tansu reports a partition's end as its last batch's first offset + 1.
    """
    changes = {p: c for p, c in changes.items() if c.writes()}
    dispatch, writer = ctx.dispatch, ctx.writer
    await ctx.progress.landed(changes)
    # Where each partition's first record of this write lands if nobody else writes meanwhile.
    first = {partition: ctx.tables(partition).next_offset for partition in changes}
    dispatch.produce_events()  # delivered with this write's records, checked below
    changelog = ctx.config.changelog_topic
    fired_bytes = min(FIRED_RECORD_BYTES, ctx.config.max_record_bytes // 2)
    deliveries = Deliveries()
    staged: dict[int, list[Record]] = {}
    produced = {} if ahead is None else ahead.counts
    for partition, part in changes.items():
        done = produced.get(partition, 0)
        table = ctx.tables(partition)
        staged[partition] = [*part.records, *table.fired_records(part.fired, fired_bytes)]
        records = islice(staged[partition], done, None)
        writer.produce_many(changelog, partition, records, deliveries, table.owner_headers)
    side = dispatch.take_side()  # this write's events and dead letters
    groups = (deliveries,) if ahead is None else (deliveries, ahead.deliveries)
    await writer.delivered(*groups, side)
    for group in groups:
        group.raise_first("changelog")
    side.raise_first("event or dead-letter")
    await _topic_progress(ctx, changes, staged)
    tails: dict[int, Record] = {}
    restating: list[int] = []
    for partition, part in changes.items():
        table = ctx.tables(partition)
        if table.unread or table.restate:
            restating.append(partition)
        tail = tails[partition] = progress_record(
            table.watermark if part.watermark is None else part.watermark,
            table.request_offset if part.request_offset is None else part.request_offset,
        )
        staged[partition].append(tail)
        table.apply(
            staged[partition],
            None,
            pending_delta=part.pending_delta,
            stale_index=part.stale_index,
            progress_on_disk=False,
            applied=part.applying,
        )
    # As the tables hold the keys, with this write applied.
    restated = await _restate(ctx, restating) if restating else {}
    tombstoned = {} if ahead is None else ahead.tombstoned
    # The tails come last in their partitions: their offsets are how far the changelog is written.
    for partition, tail in tails.items():
        table = ctx.tables(partition)
        deliveries = Deliveries(offsets=True)
        writer.produce(
            changelog,
            tail[0],
            tail[1],
            headers=table.owner_headers,
            partition=partition,
            deliveries=deliveries,
        )
        written = len(staged[partition]) + tombstoned.get(partition, 0) + restated.get(partition, 0)
        ctx.progress.add(partition, deliveries, tail, table, first[partition], written)


async def open_epoch(ctx: EngineContext, partitions: Iterable[int], epoch: int) -> None:
    """Write the owner record of ``epoch`` to each of ``partitions``' changelog, after every record
    this worker wrote before, and write under ``epoch`` from then on (:mod:`futures.worker.fencing`).

    Under the engine lock, before the partitions' recovery reads their changelog to its end: a
    replay then applies what earlier owners wrote before this record, and nothing they write after.
    """
    partitions = list(partitions)
    await ctx.progress.landed()
    deliveries = Deliveries()
    record, headers = owner_record(epoch), owner_headers(epoch)
    for partition in partitions:
        ctx.writer.produce_many(ctx.config.changelog_topic, partition, [record], deliveries, headers)
    await ctx.writer.delivered(deliveries)
    deliveries.raise_first("changelog owner record")
    for partition in partitions:
        ctx.tables(partition).own(epoch)
