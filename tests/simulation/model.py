"""The reference model: every request the clients wrote, and what each should have become.

A timer is its id; each write of it is a new version (a schedule) or a cancel, ordered by the
offset it took in its request partition. What the model knows of a write is what its client
knows: the version, the due time, the time it was written (the record's timestamp), and whether
its transaction committed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Write:
    timer_id: str
    version: int
    partition: int
    offset: int
    written_ms: int  # the record's timestamp (the client's clock, which is true)
    due_ms: int | None  # None: a cancel
    aborted: bool = False  # its transaction was aborted: it must have no effect


class Model:
    def __init__(self) -> None:
        self.writes: list[Write] = []
        self._by_id: dict[str, list[Write]] = defaultdict(list)
        self._by_version: dict[tuple[str, int], Write] = {}

    def add(self, write: Write) -> None:
        self.writes.append(write)
        self._by_id[write.timer_id].append(write)
        self._by_version[(write.timer_id, write.version)] = write

    def write_of(self, timer_id: str, version: int) -> Write | None:
        return self._by_version.get((timer_id, version))

    def committed(self, timer_id: str) -> list[Write]:
        """The writes of ``timer_id`` that count, in log order."""
        return sorted((w for w in self._by_id[timer_id] if not w.aborted), key=lambda w: w.offset)

    def later(self, write: Write) -> list[Write]:
        """Committed writes of the same timer after ``write`` in its partition's log."""
        return [w for w in self.committed(write.timer_id) if w.offset > write.offset]

    def must_fire(self) -> list[Write]:
        """Each timer's latest committed write, where it is a schedule: it must fire once the world heals."""
        latest = []
        for timer_id in self._by_id:
            writes = self.committed(timer_id)
            if writes and writes[-1].due_ms is not None:
                latest.append(writes[-1])
        return latest

    def last_due_ms(self) -> int:
        return max((w.due_ms for w in self.writes if w.due_ms is not None), default=0)
