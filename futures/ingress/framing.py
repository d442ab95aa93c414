"""The Confluent Schema Registry wire format of a protobuf record, read without the registry.

A producer that serializes through Schema Registry (confluent-kafka's
``ProtobufSerializer`` and its Java and Go twins) frames every value::

    0x00 | schema id (4 bytes, big-endian) | message indexes | protobuf message

The message indexes locate the message type in the registered ``.proto`` file:
a count, then that many indexes (the top-level message, then nested ones), each
a zig-zag varint; the array ``[0]`` (the file's first message) is written as the
single byte ``0x00``. A protobuf message never starts with byte 0 (field number
0 does not exist), so a framed value and a bare one are told apart by their
first byte, with no configuration.

Pure functions of the bytes: :func:`unframe` never raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from ktimers import timers_pb2
from ktimers.wire import REQUEST_MESSAGES

MAGIC_BYTE = 0
_HEADER = 5  # the magic byte and the schema id
#: Longest varint of a 64-bit value; longer ones are malformed.
_MAX_VARINT_BYTES = 10
#: Message-index arrays longer than this are refused before reading them: a
#: timer request is a top-level message (one index), and a count of a billion
#: must not make the parser read a billion varints.
MAX_INDEXES = 8


def _top_level_index(name: str) -> tuple[int, ...]:
    # Its position in proto/timers.proto, as the serializer computes it from the descriptor.
    return (list(timers_pb2.DESCRIPTOR.message_types_by_name).index(name),)


#: The message index of each timer request in proto/timers.proto → its ``kt-kind``.
REQUEST_KINDS: dict[tuple[int, ...], bytes] = {
    _top_level_index(message.DESCRIPTOR.name): kind for kind, message in REQUEST_MESSAGES.items()
}


@dataclass(frozen=True)
class Framed:
    """A framed value taken apart: which registered schema, which message in it, and the message."""

    schema_id: int
    #: The message indexes; empty when the array is longer than MAX_INDEXES (not read).
    indexes: tuple[int, ...]
    message: bytes
    #: Length of the message-index array as the record gives it.
    count: int = 1

    @property
    def kind(self) -> bytes | None:
        """The ``kt-kind`` the message index names in proto/timers.proto, or None: not a timer request."""
        return REQUEST_KINDS.get(self.indexes)

    def where(self) -> str:
        """The message index for a detail: ``[2]``, or how long an array too long to read was."""
        if not self.indexes:
            return f"an array of {self.count} indexes"
        return "[" + ", ".join(map(str, self.indexes)) + "]"


def is_framed(value: bytes | None) -> bool:
    """Whether ``value`` is in the Schema Registry wire format (it starts with the magic byte)."""
    return value is not None and len(value) > 0 and value[0] == MAGIC_BYTE


def unframe(value: bytes) -> Framed | str:
    """``value`` (which starts with the magic byte) taken apart, or why it is no framed message."""
    if len(value) < _HEADER + 1:
        return f"{len(value)} bytes: a framed record has a magic byte, a 4-byte schema id and message indexes"
    schema_id = int.from_bytes(value[1:_HEADER], "big")
    count, pos = _zigzag_varint(value, _HEADER)
    if count is None:
        return "the message-index array's length is not a varint"
    if count == 0:
        return Framed(schema_id, (0,), value[pos:])  # the single-byte shortcut for [0]
    if count < 0:
        return f"the message-index array's length is negative ({count})"
    if count > MAX_INDEXES:
        # Not a timer request whatever it holds; the indexes themselves need not be read.
        return Framed(schema_id, (), b"", count)
    indexes: list[int] = []
    for _ in range(count):
        index, pos = _zigzag_varint(value, pos)
        if index is None:
            return f"message index {len(indexes)} of {count} is not a varint"
        indexes.append(index)
    return Framed(schema_id, tuple(indexes), value[pos:], count)


def _zigzag_varint(data: bytes, pos: int) -> tuple[int | None, int]:
    """The zig-zag varint at ``pos`` and the position after it; None when truncated or too long."""
    raw = shift = 0
    for i in range(pos, min(len(data), pos + _MAX_VARINT_BYTES)):
        byte = data[i]
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), i + 1
        shift += 7
    return None, pos
