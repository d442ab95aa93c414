"""Tables for people, as ``kafka-consumer-groups`` prints them: a header of upper-case names,
columns padded to their widest cell, two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence

#: How an absent value shows in a table.
NONE = "-"


def cell(value: object) -> str:
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    # A cell is one line: a newline in an id or a key would break the columns.
    return str(value).replace("\n", "\\n").replace("\t", "\\t")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``header`` and ``rows`` as aligned text lines (no trailing newline); the last column unpadded."""
    cells = [[name.upper() for name in header], *([cell(v) for v in row] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )
