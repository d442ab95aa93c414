"""What every console script shares: ``--help`` that lists the environment, ``--version``,
and usage errors as one line on stderr with status 2.

``--help`` and ``--version`` are answered while parsing, so a script that parses its
arguments before anything else never touches Kafka, the data dir or Spark for them.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import textwrap
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn

from ktimers.config import NO_DEFAULT, EnvVar

DISTRIBUTION = "kafka-timers"
EXIT_USAGE = 2  # bad arguments, bad config, Kafka unreachable, an extra missing: the user must act
#: Our own top-level packages: a module of theirs that is missing is a broken install, not an extra.
OUR_PACKAGES = frozenset({"ktimers", "futures", "oscillator", "proto", "tools"})
#: Help is as wide as the terminal (as argparse does), within these bounds (columns).
HELP_WIDTH = (60, 110)
_UNBROKEN = "\x00"  # a space textwrap must not break at

#: A titled list of variables in ``--help``, e.g. ("environment, worker", WORKER_ENV).
EnvGroup = tuple[str, Sequence[EnvVar]]


def version() -> str:
    """``kafka-timers 0.1.0``: the installed distribution's version."""
    try:
        number = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        number = "unknown"
    return f"{DISTRIBUTION} {number}"


class UsageError(Exception):
    """A command line or input problem; the message says how to fix it.

    ``prog`` names the (sub)command it concerns; empty means the running command.
    """

    def __init__(self, message: str, prog: str = "") -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see: {self.prog} --help)", self.prog)


def help_width() -> int:
    """Columns of ``--help``: the terminal's (``COLUMNS`` when set) minus 2, as argparse has it."""
    low, high = HELP_WIDTH
    return max(low, min(high, shutil.get_terminal_size().columns - 2))


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the environment listing as laid out, at the width it was laid out for."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=help_width())


def env_help(groups: Sequence[EnvGroup], width: int | None = None) -> str:
    """The variables of ``groups`` as help text: one entry per variable, with its default."""
    width = help_width() if width is None else width
    names = [var.name for _, variables in groups for var in variables]
    column = max(map(len, names), default=0) + 4
    blocks = []
    for title, variables in groups:
        lines = [f"{title}:"]
        for var in variables:
            text = var.meaning
            if var.default != NO_DEFAULT:
                # Kept on one line: "[default:" alone at the end of a line reads badly.
                text += " [default:" + _UNBROKEN + var.default.replace(" ", _UNBROKEN) + "]"
            wrapped = textwrap.wrap(
                text,
                width,
                initial_indent=f"  {var.name}".ljust(column),
                subsequent_indent=" " * column,
                break_on_hyphens=False,
                break_long_words=False,  # a default stays whole, even past the width
            )
            lines += [line.replace(_UNBROKEN, " ") for line in wrapped]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def command_parser(
    prog: str, description: str, env: Sequence[EnvGroup], parser_class: type[Parser] = Parser
) -> Parser:
    """A parser with ``--version`` whose ``--help`` ends with the variables of ``env``.

    Each line of ``description`` is a paragraph, wrapped to the help's width.
    """
    width = help_width()
    parser = parser_class(
        prog=prog,
        description="\n".join(textwrap.fill(line, width) for line in description.splitlines()),
        epilog=env_help(env, width),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=version())
    return parser


def fail(prog: str, message: str) -> int:
    """Print ``prog: error: message`` on stderr; return the usage exit status."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (default ``sys.argv[1:]``) or exit: 0 after ``--help``/``--version``,
    2 after printing a usage error as one line."""
    try:
        return parser.parse_args(argv)
    except UsageError as exc:
        raise SystemExit(fail(exc.prog or parser.prog, str(exc))) from exc


def missing_extra(extra: str, module: str) -> str:
    """What to install when ``module`` (a third-party one) is missing: ``extra`` of the install,
    or the base install for ""."""
    what = f"kafka-timers[{extra}]" if extra else "kafka-timers"
    return f"the Python module {module!r} is not installed: pip install '{what}'"


def run_command(prog: str, extra: str, module: str) -> int:
    """Run ``module.main()`` as the console script ``prog``; its exit status.

    The module is imported only now, so a command whose ``extra`` (pyproject.toml's
    optional dependencies) is not installed says which one to install, in one line with
    status 2, rather than a traceback: on ``--help`` as on a run.
    """
    try:
        code = importlib.import_module(module).main()
    except ModuleNotFoundError as exc:
        package = (exc.name or "").partition(".")[0]
        if not package or package in OUR_PACKAGES:
            raise
        return fail(prog, f"{prog} needs the {extra or 'base'} install: {missing_extra(extra, package)}")
    return 0 if code is None else int(code)
