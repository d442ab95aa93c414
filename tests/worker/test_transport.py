"""How the transport cuts a fetched batch of requests into engine steps."""

from __future__ import annotations

from types import SimpleNamespace

from futures.worker.transport import CHUNK_BYTES, _chunks


def records(n: int, size: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(value=b"x" * size) for _ in range(n)]


def test_pieces_keep_every_record_in_order_bounded_by_count_and_bytes() -> None:
    small, big = records(5, 10), records(3, CHUNK_BYTES // 2 + 1)
    pieces = list(_chunks([("p0", small), ("p1", big)], 3))
    assert [[(tp, len(part)) for tp, part in piece] for piece in pieces] == [
        [("p0", 3)],
        [("p0", 2), ("p1", 1)],  # three records
        [("p1", 2)],  # two big values pass the byte bound
    ]
    assert [r for piece in pieces for _, part in piece for r in part] == small + big
    assert list(_chunks([], 3)) == []
