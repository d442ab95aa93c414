"""Protobuf wire bytes written by hand, for inputs protobuf's own serialiser never writes."""

from __future__ import annotations


def varint(number: int) -> bytes:
    """``number`` (0 ≤ number < 2**64) as a protobuf varint."""
    out = bytearray()
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)
