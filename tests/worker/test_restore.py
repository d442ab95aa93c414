"""A table on disk caught up from where it stopped is exact while the changelog keeps the tombstones
written since, and only then: what the store's reuse window (futures/worker/changelog_topic.py)
rests on."""

from __future__ import annotations

import asyncio
import shutil

from futures.worker.table import PartitionTimers
from tests.worker.kafka_log import PartitionLog, compact, restore
from tests.worker.rig import T_MS, MakeRig, T


def test_a_table_caught_up_from_where_it_stopped_is_exact_until_the_tombstones_written_since_expire(
    make_rig: MakeRig,
) -> None:
    log = PartitionLog()
    a = make_rig()
    a.ingest(*(a.request(f"c{i}", T_MS + 3000 + i) for i in range(10)), a.request("kept", T_MS + 9000))
    a.tick(T)
    a.owned = {1, 2, 3}  # assigned elsewhere: A's table as it was then
    a.engine.revoke([0])
    asyncio.run(a.engine.settle_revoked())
    log.append(a.changelog())
    path = a.table(0).path
    a.close()
    stale = a.directory / "stale.db"
    shutil.copytree(path, stale)

    b = make_rig()
    b.follows(a)
    restore(b.table(0), log.read())
    b.ingest(b.cancel("c9"))
    b.tick(T + 4)  # fires the other nine
    asyncio.run(b.sweep())
    assert sorted(b.fired()) == [f"c{i}" for i in range(9)]
    log.append(b.changelog())

    for expired, back in [(False, []), (True, [f"c{i}" for i in range(10)])]:
        table = PartitionTimers(stale)
        try:
            assert table.persisted_offset is not None
            since = [
                r for r in compact(log.read(), expire_tombstones=expired) if r.offset > table.persisted_offset
            ]
            restore(table, since)
            assert [d.timer_id for d in table.iter_pending()] == [*back, "kept"]
        finally:
            table.close()
            shutil.rmtree(stale)
            shutil.copytree(path, stale)
