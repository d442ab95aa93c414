"""Dead-letter records that can always be delivered, whatever the record that caused them.

A dead letter copies the rejected record and adds headers that say why. The
copy plus those headers is larger than the original, so a record that was just
under the broker's limit would make a dead letter over it: the producer refuses
it, and a worker that cannot write its dead letter cannot acknowledge the
record — it stops, and so does every worker that reads the record after it.

:func:`dead_letter` keeps the copy within the producer's limit: when it does
not fit, the copied value (then the copied headers, then the key) is cut, and
``kt-truncated`` names what was cut, with the original size in
``kt-original-size``. Details for people (``kt-error``, log lines, event
reasons) go through :func:`short`, so none grows with the input.
"""

from __future__ import annotations

from collections.abc import Sequence

from ktimers.wire import KafkaHeaders

#: What was cut from a dead letter's copy: comma-separated ``key``, ``value``, ``headers``.
H_TRUNCATED = "kt-truncated"
#: Size of the rejected record as it was sent: key + value + header keys and values (bytes).
H_ORIGINAL_SIZE = "kt-original-size"

#: Longest human-readable detail (characters) in a dead letter, an event or a log line.
MAX_DETAIL_CHARS = 400
#: Longest key kept on a truncated dead letter (bytes).
MAX_TRUNCATED_KEY_BYTES = 1024
#: Bytes librdkafka and the record format add per header beyond its key and value (varints).
_HEADER_OVERHEAD = 10
#: Bytes of record framing kept free below the producer's limit.
_RECORD_OVERHEAD = 512


def short(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` cut to ``limit`` characters, marked with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable_header_key(key: str) -> str:
    """A header key a producer accepts: keys that were not UTF-8 come back as backslash escapes.

    Keys decoded with ``surrogateescape`` (see ``futures/worker/fetch.py``) hold lone
    surrogates, which librdkafka cannot encode (confluent-kafka crashes on them).
    """
    try:
        key.encode()
    except UnicodeEncodeError:
        # surrogateescape gives back the bytes a fetch could not decode; any other lone surrogate is escaped.
        raw = (
            key.encode("utf-8", "surrogateescape")
            if _escaped_bytes_only(key)
            else key.encode("utf-8", "backslashreplace")
        )
        return raw.decode("utf-8", "backslashreplace")
    return key


def _escaped_bytes_only(key: str) -> bool:
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in key)


def headers_size(headers: KafkaHeaders) -> int:
    """Bytes of ``headers`` as a record holds them (UTF-8 keys, values, framing)."""
    return _content_size(headers) + _HEADER_OVERHEAD * len(headers)


def _content_size(headers: KafkaHeaders) -> int:
    # surrogatepass: a key that was not UTF-8 counts about as long as it was (and never raises).
    return sum(len(key.encode("utf-8", "surrogatepass")) + len(value or b"") for key, value in headers)


def dead_letter(
    key: bytes | None,
    value: bytes | None,
    headers: KafkaHeaders,
    ours: Sequence[tuple[str, bytes]],
    max_bytes: int,
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """The dead letter of a record (``key``, ``value``, ``headers``) with ``ours`` added last.

    The result fits in ``max_bytes`` (the producer's ``message.max.bytes``):
    cut down where it must be, with ``kt-truncated`` and ``kt-original-size``.
    ``ours`` must be small (details through :func:`short`).
    """
    copied = [(printable_header_key(k), v) for k, v in headers]
    size_of_copy = len(key or b"") + len(value or b"") + headers_size(copied)
    budget = max_bytes - _RECORD_OVERHEAD - headers_size(ours)
    if size_of_copy <= budget:
        return key, value, [*copied, *ours]
    original = len(key or b"") + len(value or b"") + _content_size(headers)
    cut: list[str] = []
    # Room for the two headers added below.
    budget -= 2 * _HEADER_OVERHEAD + len(H_TRUNCATED) + len(H_ORIGINAL_SIZE) + 40
    if key is not None and len(key) > MAX_TRUNCATED_KEY_BYTES:
        key = key[:MAX_TRUNCATED_KEY_BYTES]
        cut.append("key")
    if headers_size(copied) > budget // 2:
        copied = _cut_headers(copied, budget // 2)
        cut.append("headers")
    room = max(budget - len(key or b"") - headers_size(copied), 0)
    if value is not None and len(value) > room:
        value = value[:room]
        cut.append("value")
    marks = [(H_TRUNCATED, ",".join(cut).encode()), (H_ORIGINAL_SIZE, str(original).encode())]
    return key, value, [*copied, *ours, *marks]


def _cut_headers(headers: list[tuple[str, bytes | None]], budget: int) -> list[tuple[str, bytes | None]]:
    """The first headers that fit in ``budget`` bytes, each key and value cut to a readable length."""
    kept: list[tuple[str, bytes | None]] = []
    used = 0
    for key, value in headers:
        item = (short(key, 200), None if value is None else value[:MAX_TRUNCATED_KEY_BYTES])
        size = headers_size([item])
        if used + size > budget:
            break
        kept.append(item)
        used += size
    return kept
