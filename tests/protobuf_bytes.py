"""Protobuf wire bytes written by hand, for inputs protobuf's own serialiser never writes."""

from __future__ import annotations

from hypothesis import strategies as st

from ktimers.wire import Future


def varint(number: int) -> bytes:
    """``number`` (0 ≤ number < 2**64) as a protobuf varint."""
    out = bytearray()
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def padded_varint(number: int, size: int, high: int = 0) -> bytes:
    """``number`` (0 ≤ number < 2**64) as a varint of ``size`` bytes (at least its shortest, at
    most eleven), as some writers pad them; ``high`` (< 0x80) sets bits of a tenth byte past
    the 64th, which protobuf drops."""
    groups = [(number >> (7 * i)) & 0x7F for i in range(max(size, 10))]
    if size >= 10:
        groups[9] |= high
    last = max((i for i, g in enumerate(groups) if g), default=0)
    size = max(size, last + 1)
    return bytes([g | 0x80 for g in groups[: size - 1]] + [groups[size - 1]])


def tag(number: int, wire: int, size: int = 1) -> bytes:
    """A field's tag (``number << 3 | wire``) as a varint of at least ``size`` bytes."""
    return padded_varint(number << 3 | wire, size)


def group(number: int, inner: bytes) -> bytes:
    """Field ``number`` as a group holding ``inner`` (start-group, the fields, end-group)."""
    return tag(number, 3) + inner + tag(number, 4)


def nested_groups(depth: int, number: int = 15) -> bytes:
    """``depth`` groups, each inside the one before."""
    return tag(number, 3) * depth + tag(number, 4) * depth


def unknown_fields(numbers: st.SearchStrategy[int], max_size: int = 3) -> st.SearchStrategy[bytes]:
    """Valid fields of field numbers ``numbers``, of every wire type as a writer may lay them
    out: varints of up to ten bytes (a tenth holding bits past the 64th), tags and lengths of
    up to five, fixed 64 and 32 bits, length-delimited bytes, and groups holding such fields,
    nested. Unknown to our messages where ``numbers`` are (9 and up)."""
    sizes = st.integers(1, 10)
    scalar = st.one_of(
        st.builds(
            lambda n, s, v, vs, high: tag(n, 0, s) + padded_varint(v, vs, high),
            numbers, st.integers(1, 5), st.integers(0, 2**64 - 1), sizes, st.integers(0, 0x7F),
        ),
        st.builds(
            lambda n, s, v: tag(n, 1, s) + v, numbers, st.integers(1, 5), st.binary(min_size=8, max_size=8)
        ),
        st.builds(
            lambda n, v, ls: tag(n, 2) + padded_varint(len(v), ls) + v,
            numbers, st.binary(max_size=8), st.integers(1, 5),
        ),
        st.builds(lambda n, v: tag(n, 5) + v, numbers, st.binary(min_size=4, max_size=4)),
    )  # fmt: skip
    field = st.recursive(
        scalar,
        lambda inner: st.builds(
            lambda n, fields: group(n, b"".join(fields)), numbers, st.lists(inner, max_size=3)
        ),
        max_leaves=6,
    )
    return st.lists(field, max_size=max_size).map(b"".join)


#: Field numbers: ours (1-8, read with their own wire type or skipped with another), new ones,
#: the largest there is.
field_numbers = st.one_of(st.integers(1, 20), st.sampled_from([2**29 - 1, 1000, 16]))


def wire_soup() -> st.SearchStrategy[bytes]:
    """Bytes near protobuf's rules: valid fields, tags of any wire type (6 and 7 too), field
    number (0 too) and size (six bytes too) with nothing after them, stray end-groups, varints
    of eleven bytes, lengths of six, bytes at random; the end cut off or not."""
    token = st.one_of(
        unknown_fields(field_numbers, max_size=1),
        st.builds(tag, st.integers(0, 20), st.integers(0, 7), st.integers(1, 6)),
        st.builds(lambda n: tag(n, 4), st.integers(1, 20)),
        st.just(b"\x80" * 10 + b"\x00"),
        st.builds(lambda n: tag(n, 2) + padded_varint(0, 6), st.integers(1, 20)),  # a length of six bytes
        st.binary(max_size=3),
    )
    return st.tuples(st.lists(token, max_size=6).map(b"".join), st.integers(0, 64)).map(
        lambda parts: parts[0][: len(parts[0]) - parts[1]] if parts[1] < 8 else parts[0]
    )


# Futures as producers of other languages or newer schemas write them, which protobuf reads:
# unknown fields of every wire type, laid out as a writer may. Each must fire as it was sent.
UNKNOWN_FIELDS = {
    "group": b"\x7b\x7c",  # field 15, start-group and end-group
    "ten-byte varint": b"\x78" + b"\xff" * 9 + b"\x7f",  # field 15, bits past the 64th
    "padded varint": b"\x78\x81" + b"\x80" * 8 + b"\x00",  # 1, in ten bytes
    "nested groups": group(15, group(16, b"\x08\x01" + group(17, b"")) + b"\x12\x00"),
    "every wire type": (
        b"\x78\x01"  # varint
        + b"\x79" + b"\x00" * 8  # fixed 64
        + b"\x7a\x02ab"  # length-delimited
        + group(15, b"\x08\x01")
        + b"\x7d" + b"\x00" * 4  # fixed 32
    ),
    "known numbers with other wire types": group(3, b"") + b"\x2a\x00" + b"\x0d\x00\x00\x00\x00",
}  # fmt: skip


def unknown_fields_future(timer_id: str, due_ms: int, extra: bytes) -> bytes:
    """A Future with ``extra`` fields among its own, on both sides of its headers."""
    future = Future(
        callBackTopic="orders",
        callBackKey=f"key-{timer_id}",
        callBack=b"payload-" + timer_id.encode(),
        id=timer_id,
        due_ms=due_ms,
        token="tok",
    ).SerializeToString()
    header = b"\x3a" + bytes([len(b"\x0a\x01h\x12\x01v" + extra)]) + b"\x0a\x01h\x12\x01v" + extra
    return extra + future + header + extra
