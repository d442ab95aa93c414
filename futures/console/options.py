"""The option types of the ``timers`` command: each turns the text typed into a value, or
into an ``argparse`` error that says what to type (one line, status 2)."""

from __future__ import annotations

import argparse

from futures.durations import parse_duration, parse_instant

#: Most timers in one page of ``timers list`` (the admin API's ceiling).
MAX_PAGE = 1000


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def instant(text: str) -> float:
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"header {text!r}: expected NAME=VALUE")
    return name, value


def port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return port


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least 1")
    return value


def page_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_PAGE:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_PAGE} timers a page")
    return value


def partition(text: str) -> int:
    return _non_negative(text, "a partition number (0, 1, …)")


def offset(text: str) -> int:
    return _non_negative(text, "an offset (0, 1, …)")


def _non_negative(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {what}")
    return value


def add_delivery_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--delivery-timeout",
        type=duration,
        default=15.0,
        help="give up if Kafka has not acknowledged the record after this long (default 15s)",
    )
