# The compiled module's types (table_write.pyx).
from collections.abc import Callable, Iterable

from rocksdict import ColumnFamily, Rdict, WriteBatch

TIMER_PREFIX: bytes
FIRED_PREFIX: bytes
INDEX_PREFIX: bytes
PROGRESS_KEY: bytes
TOPIC_PROGRESS_PREFIX: bytes
RANGE_MIN_KEYS: int

def fill(
    batch: WriteBatch,
    db: Rdict,
    ids: Rdict,
    ids_cf: ColumnFamily,
    records: Iterable[tuple[bytes, bytes | None]],
    replay: bool,
    below: bytes,
    low: int | None,
    stale_index: Iterable[bytes],
    topic_offset: Callable[[str], int],
    watermark: int,
    request_offset: int,
    fired_seq: int,
) -> tuple[int, int | None, int, int, dict[str, int], int]: ...
