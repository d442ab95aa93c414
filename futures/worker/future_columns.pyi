# The compiled module's types (future_columns.pyx).
from collections.abc import Callable

from futures.ingress.records import SourceRecord

def read_futures(
    value: bytes,
    batch: bool,
    tail: tuple[bytes, bytes],
    offset: int,
    derive: Callable[[SourceRecord, int | None], str],
    record: SourceRecord,
) -> tuple[list[str], list[bytes], list[int], list[str], list[bytes], int, int] | None: ...
