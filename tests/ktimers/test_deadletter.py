"""Dead letters always fit the producer's limit, whatever they copy (fuzzed)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ktimers.deadletter import (
    H_ORIGINAL_SIZE,
    H_TRUNCATED,
    MAX_DETAIL_CHARS,
    dead_letter,
    headers_size,
    printable_header_key,
    short,
)

OURS = [("kt-reason", b"undecodable"), ("kt-error", short("x" * 10_000).encode())]

# Header keys as the consumer hands them on: text, or bytes that were not UTF-8 (surrogateescape).
header_keys = st.one_of(
    st.text(max_size=50),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=5),
    st.binary(max_size=50).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
sizes = st.sampled_from([0, 1, 100, 10_000, 500_000, 999_000, 2_000_000])


def _size(key, value, headers) -> int:
    return len(key or b"") + len(value or b"") + headers_size(headers)


@settings(max_examples=150, deadline=None)
@given(
    key_size=sizes,
    value_size=sizes,
    headers=st.lists(st.tuples(header_keys, st.one_of(st.none(), sizes.map(lambda n: b"h" * n))), max_size=5),
    max_bytes=st.sampled_from([100_000, 1_000_000, 1_016_384]),
)
def test_a_dead_letter_fits_and_says_what_was_cut(key_size, value_size, headers, max_bytes):
    key, value = b"k" * key_size, b"v" * value_size
    out_key, out_value, out_headers = dead_letter(key, value, headers, OURS, max_bytes)

    assert _size(out_key, out_value, out_headers) <= max_bytes
    for name, _ in out_headers:
        name.encode()  # every key is sendable
    names = [name for name, _ in out_headers]
    assert names.index("kt-reason") < len(names)
    if H_TRUNCATED in names:
        marks = dict(out_headers)
        sent = (
            len(key)
            + len(value)
            + sum(len(k.encode("utf-8", "surrogatepass")) + len(v or b"") for k, v in headers)
        )
        assert int(marks[H_ORIGINAL_SIZE] or b"0") == sent
        assert out_value == value[: len(out_value or b"")]
    else:
        assert (out_key, out_value) == (key, value)
        assert out_headers[: len(headers)] == [(printable_header_key(k), v) for k, v in headers]


def test_a_header_key_that_was_not_utf8_becomes_escaped_text():
    assert printable_header_key(b"\xff\xfeid".decode("utf-8", "surrogateescape")) == "\\xff\\xfeid"
    assert printable_header_key("plain") == "plain"
    assert printable_header_key("a\ud800b") == "a\\ud800b"


def test_details_are_bounded():
    assert short("a" * 100_000) == "a" * (MAX_DETAIL_CHARS - 1) + "…"
    assert short("fine") == "fine"
