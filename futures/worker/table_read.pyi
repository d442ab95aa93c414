# The compiled module's types (table_read.pyx).
from collections.abc import Iterable

from rocksdict import Rdict

def take_due(
    items: Iterable[tuple[bytes, bytes]], max_count: int, max_bytes: int | None
) -> list[tuple[bytes, bytes]]: ...
def keys_between(db: Rdict, first: bytes, last: bytes, most: int) -> list[bytes]: ...
