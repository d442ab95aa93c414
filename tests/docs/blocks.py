"""The fenced code blocks of the documentation, and which of their shell commands are safe to run."""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Every page whose code blocks the tests run: the README, docs/ and the chart's README.
PAGES: tuple[Path, ...] = (
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "helm" / "kafka-timers" / "README.md",
)

PYTHON = frozenset({"python", "py"})
SHELL = frozenset({"bash", "sh", "shell", "console"})
#: Parsed as data: YAML (chart values in the chart's README), JSON.
DATA = frozenset({"yaml", "yml", "json"})
#: Output, or a fragment not meant to run.
SKIPPED = frozenset({"text"})
LANGUAGES = PYTHON | SHELL | DATA | SKIPPED

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")

#: Commands a test may run against the documentation stack: they only read, print, create
#: callback topics, or schedule and cancel timers, and they end by themselves (``timers watch``
#: only with ``--timeout``).
SAFE_COMMANDS = (
    re.compile(r"timers(-[a-z]+)?( [a-z]+)? --help"),
    re.compile(r"timers(-[a-z]+)? --version"),
    re.compile(r"timers watch \S+( --from-beginning)?( --count \d+)? --timeout \S+"),
    re.compile(r"timers (schedule|cancel) .*"),
    re.compile(r"timers topics check"),
    re.compile(r"timers topics create( --callback [\w.-]+)+"),
    re.compile(r"make help"),
)


@dataclass(frozen=True)
class Block:
    page: Path
    #: 1-based line of the opening fence.
    line: int
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(text: str, page: Path) -> list[Block]:
    """The fenced blocks of a Markdown text, in order; indented blocks (in lists) are dedented."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.fullmatch(
            rf" {{0,{indent}}}{fence[0]}{{{len(fence)},}}\s*", lines[j]
        ):
            body.append(lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: a code block is never closed")
        language = opening["info"].strip().split(" ")[0].lower()
        found.append(Block(page, i + 1, language, textwrap.dedent("\n".join(body)) + "\n"))
        i = j + 1
    return found


def shell_script(block: Block) -> str:
    """The commands of a shell block: a console block's ``$ `` lines, or all of a bash block."""
    if block.language != "console":
        return block.code
    return "".join(line[2:] + "\n" for line in block.code.splitlines() if line.startswith("$ "))


def commands(script: str) -> list[str]:
    """Each command of a script, continuation lines joined and comments dropped."""
    joined = script.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            found.append(shlex.join(words))
    return found


#: Pipes, lists, redirections, substitutions: a command holding one is never run.
_SHELL_SYNTAX = re.compile(r"[;|&<>`$()]")


def is_safe(script: str) -> bool:
    """True when every command of ``script`` is one a test may run (see :data:`SAFE_COMMANDS`)."""
    found = commands(script)
    return bool(found) and all(
        any(p.fullmatch(c) for p in SAFE_COMMANDS) and not _SHELL_SYNTAX.search(c) for c in found
    )
