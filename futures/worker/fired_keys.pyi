# The compiled module's types (fired_keys.pyx).
from collections.abc import Iterable

FIRED_RECORD_BYTES: int

def pack_keys(keys: Iterable[bytes], max_bytes: int = ...) -> list[bytes]: ...
def unpack_keys(value: bytes) -> list[bytes]: ...
