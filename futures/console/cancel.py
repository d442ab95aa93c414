"""``timers cancel``: cancel a pending timer by id, and with ``--wait`` say whether it was pending."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from futures.client import TimerClient
from futures.console import connect, decode
from futures.console.answers import EventTail
from futures.console.options import add_delivery_timeout, duration
from futures.console.output import EXIT_INCOMPLETE, EXIT_NOT_PENDING, kafka_log, print_json
from futures.durations import DURATION_HELP
from ktimers.cli import UsageError
from ktimers.wire import TimerEvent

#: How long ``timers cancel --wait`` waits for the worker's answer by default (seconds).
CANCEL_WAIT_S = 30.0


def add_parser(commands: Any) -> None:
    """Add ``cancel`` to the subparsers ``commands``."""
    cancel = commands.add_parser("cancel", help="cancel a pending timer by id")
    cancel.add_argument("id", metavar="ID", help="timer id, as printed by `timers schedule`")
    cancel.add_argument("--key", help="request record key the timer was scheduled with (default: the id)")
    cancel.add_argument(
        "--wait",
        action="store_true",
        help="wait for the worker's answer on timer-events: exit 0 when CANCELLED, "
        f"{EXIT_NOT_PENDING} when CANCEL_MISSED (not pending: unknown id or already fired), "
        f"{EXIT_INCOMPLETE} when no answer came before --timeout",
    )
    cancel.add_argument(
        "--timeout",
        type=duration,
        help=f"with --wait: give up after this long (default 30s): {DURATION_HELP}",
    )
    add_delivery_timeout(cancel)
    cancel.set_defaults(run=_cancel)


def _cancel(args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.wait:
        raise UsageError("--timeout is how long --wait waits: give --wait too", "timers cancel")
    common = connect.common()
    client = connect.client(common, args.delivery_timeout)
    sent = {"id": args.id, "record_key": args.key or args.id}
    if not args.wait:
        _send_cancel(client, args)
        print_json({**sent, "cancel": "sent"})
        return 0
    timeout = CANCEL_WAIT_S if args.timeout is None else args.timeout
    deadline = time.monotonic() + timeout
    with EventTail(common, kafka_log) as tail:
        tail.catch_up(deadline)
        _send_cancel(client, args)
        event = tail.wait_for(args.id, (TimerEvent.CANCELLED, TimerEvent.CANCEL_MISSED), deadline)
    if event is None:
        print_json({**sent, "cancel": "no-answer"})
        print(
            f"timers cancel: the cancel of {args.id!r} was sent, but {common.topics.events!r} had no answer "
            f"within {timeout:g}s: is a worker running? (a longer --timeout waits more)",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    answer = {
        **sent,
        "cancel": "cancelled" if event.kind == TimerEvent.CANCELLED else "missed",
        **{k: v for k, v in decode.event_json(event).items() if k not in ("id", "source_offset")},
    }
    print_json(answer)
    if event.kind == TimerEvent.CANCELLED:
        return 0
    print(f"timers cancel: {args.id!r} was not pending: unknown id, or it already fired", file=sys.stderr)
    return EXIT_NOT_PENDING


def _send_cancel(client: TimerClient, args: argparse.Namespace) -> None:
    try:
        client.cancel(args.id, record_key=args.key)
    except ValueError as exc:
        raise UsageError(str(exc), "timers cancel") from exc
    connect.send_and_wait(client, args.delivery_timeout)
