# The compiled module's types (future_columns.pyx).
from collections.abc import Callable

from futures.ingress.records import SourceRecord

#: The records of the timers (once each), ids, ids UTF-8 encoded, due times, callback topics,
#: StoredTimer bytes, the longest id's bytes, the largest id and stored bytes together, and
#: whether the records say every id is new (``kt-ids: new``).
Columns = tuple[list[SourceRecord], list[str], list[bytes], list[int], list[str], list[bytes], int, int, bool]

def read_records(
    records: list[SourceRecord],
    max_timers: int,
    tail: tuple[bytes, bytes],
    derive: Callable[[SourceRecord, int | None], str],
) -> tuple[Columns | None, int]: ...
