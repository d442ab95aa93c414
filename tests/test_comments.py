"""No measured figure in a comment of the product's code: figures live in docs/PERFORMANCE.md.

A measurement ages as the code, the libraries and the machines change; in a comment nobody
re-runs it. A comment says why a choice was made and points at the section of
docs/PERFORMANCE.md that holds the figure and the command that measures it again.

Comments and docstrings (any string that is a statement of its own) of every module under
futures/, ktimers/ and oscillator/, compiled ones included, are scanned for a number followed
by a unit that only a measurement gives: time per call (µs, ns, "ms a"), a rate (k/s,
"records/s"), a decimal size (MB, GB: configured sizes are written in binary units, MiB and
KiB), a percentage, an "x faster", an approximate or ranged duration ("~2 ms", "5-10 ms") or a
number after "measured". A default value ("librdkafka's default is 1 GB", "1 GiB by default")
is a definition, not a measurement; the few other definitions are listed in :data:`DEFINITIONS`.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("futures", "ktimers", "oscillator")
SUFFIXES = (".py", ".pyx", ".pxd")

MEASURED = re.compile(
    r"\d\s*(?:µs|us|ns)\b"
    r"|\d\s*ms\s+(?:a|an|per|each)\b"
    r"|\d\s*(?:MB|GB|KB)\b"
    r"|\d\s*(?:[kM]\s*)?(?:[a-z]+\s*)?/s\b"
    r"|\d\s*%"
    r"|\d\s*[x×]\s+(?:faster|slower|less|more)\b"
    r"|~\s*\d[\d.,]*\s*(?:ms|s|bytes)\b"
    r"|\d\s*[–-]\s*\d[\d.,]*\s*(?:ms|s)\b"
    r"|\bmeasured\b\D*\d"
)
_DEFAULT_BEFORE = re.compile(r"default(?:\s+(?:is|of))?\s*$", re.IGNORECASE)
_DEFAULT_AFTER = re.compile(r"^\s*by default", re.IGNORECASE)

#: (file, text) of the figures that are definitions, not measurements.
DEFINITIONS = {
    ("futures/worker/table.py", "~1 % false positives"),  # a bloom filter's rate at 10 bits a key
}


def _sources() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (REPO / package).rglob("*")
        if path.suffix in SUFFIXES and not path.name.endswith("_pb2.py")
    )


def _comments(source: str) -> list[tuple[int, str]]:
    """Comment lines and the lines of strings that stand as statements (docstrings), numbered."""
    found: list[tuple[int, str]] = []
    starts_statement = True
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and starts_statement:
            found.extend((token.start[0] + i, line) for i, line in enumerate(token.string.splitlines()))
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            starts_statement = token.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return found


def measured_figures(relative: str, source: str) -> list[str]:
    """Each ``file:line: text`` of ``source`` whose comment quotes a measured figure."""
    hits = []
    for number, line in _comments(source):
        hit = False
        for match in MEASURED.finditer(line):
            before, after = line[: match.start()], line[match.end() :]
            if _DEFAULT_BEFORE.search(before.rstrip("0123456789.,~ ")) or _DEFAULT_AFTER.match(after):
                continue
            if any(relative == path and text in line for path, text in DEFINITIONS):
                continue
            hit = True
        if hit:
            hits.append(f"{relative}:{number}: {line.strip()}")
    return hits


def test_no_comment_of_the_product_quotes_a_measured_figure() -> None:
    hits = [
        hit
        for path in _sources()
        for hit in measured_figures(path.relative_to(REPO).as_posix(), path.read_text())
    ]
    assert not hits, "move these figures to docs/PERFORMANCE.md, keep the why:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "comment",
    [
        "# a record cost 1.4-2.0 µs to queue",
        "# the lookup took ~0.3-0.6 ms a lookup",
        "# caps a worker near 2 k/s",
        "# capped a consumer near 212 k msg/s on the embedded broker",
        "# reached a receiver at 10,000/s",
        "# compaction writes 1.1 GB this way",
        "# costs ~10 % of a compaction's CPU",
        "# 3x faster than a get each",
        '"""Measured: 15-60 MB of resident memory."""',
        "# a round trip of 5-10 ms, a dozen times a second",
        "# holding the engine lock (~2 ms)",
        "# (measured with tracemalloc: 795 bytes a timer)",
    ],
)
def test_a_measured_figure_is_found(comment: str) -> None:
    assert measured_figures("futures/x.py", comment + "\n")


@pytest.mark.parametrize(
    "source",
    [
        "# librdkafka's default is 1 GB\n",
        "# all tasks share one JVM's memory (1 GiB by default)\n",
        "# a memtable of 64 MiB\n",
        "# wait 100 ms for a fetch\n",
        'x = "costs 5 µs"  # a string in code is no comment\n',
    ],
)
def test_a_definition_is_not_a_measurement(source: str) -> None:
    assert measured_figures("futures/x.py", source) == []


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_the_sections_comments_point_at_exist() -> None:
    cited = re.compile(r"docs/(\w+\.md)#([\w-]+)")
    broken = [
        f"{path.relative_to(REPO)}:{number}: {match.group(0)}"
        for path in _sources()
        for number, line in _comments(path.read_text())
        for match in cited.finditer(line)
        if match.group(2) not in _anchors(REPO / "docs" / match.group(1))
    ]
    assert not broken, "\n".join(broken)
