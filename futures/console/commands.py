"""The ``timers`` commands an operator asks the running service with: ``list``, ``show``,
``status`` (the workers' admin API, :mod:`futures.console.admin`) and ``deadletter resend``
(:mod:`futures.console.resend`): their options, and what they print."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from futures.console import resend
from futures.console.admin import ADMIN_URL_ENV, DEFAULT_ADMIN_URL, AdminApi, admin_url, token_from
from futures.console.options import MAX_PAGE, add_delivery_timeout, instant, offset, page_size, partition
from futures.console.output import EXIT_NOT_PENDING, kafka_log, print_json, shown_time
from futures.console.pending import detail_lines, list_timers, show_timer
from futures.console.status import cluster_status, request_lag, status_tables
from futures.console.table import table
from futures.durations import INSTANT_HELP
from ktimers.cli import UsageError
from ktimers.config import DEFAULT_APP_ID, CommonConfig

#: How often a worker lists the cluster's topics to learn the callback topics that exist (seconds).
TOPIC_REFRESH_S = 30.0


def add_commands(commands: Any) -> None:
    """Add ``list``, ``show``, ``status`` and ``deadletter`` to the subparsers ``commands``."""
    listing = commands.add_parser(
        "list", help="list pending timers, earliest first, from every worker (their admin API)"
    )
    listing.add_argument(
        "--from", dest="from_at", metavar="TIME", type=instant, help=f"due at or after: {INSTANT_HELP}"
    )
    listing.add_argument(
        "--to", dest="to_at", metavar="TIME", type=instant, help=f"due before: {INSTANT_HELP}"
    )
    listing.add_argument(
        "--limit",
        metavar="N",
        type=page_size,
        default=100,
        help=f"timers per page (1 to {MAX_PAGE}, default 100)",
    )
    listing.add_argument(
        "--after", metavar="CURSOR", help="the next page: the cursor the previous one ended with"
    )
    listing.add_argument(
        "--partition", metavar="P", type=partition, help="only the timers of this request partition"
    )
    _add_admin(listing)
    listing.set_defaults(run=_list)

    show = commands.add_parser("show", help="show one pending timer, from the worker that holds it")
    show.add_argument("id", metavar="ID", help="timer id")
    show.add_argument(
        "--payload", action="store_true", help="with its payload (the first 4 KiB) and header values"
    )
    _add_admin(show)
    show.set_defaults(run=_show)

    status = commands.add_parser(
        "status",
        help="the service at a glance: workers and their partitions, clocks, pending timers, "
        "requests not yet taken in, oscillators, dead letters",
    )
    _add_admin(status)
    status.set_defaults(run=_status)

    letters = commands.add_parser(
        "deadletter", help="send a dead letter's request again, once its cause is fixed"
    )
    letter_commands = letters.add_subparsers(dest="deadletter_command", metavar="ACTION", required=True)
    resending = letter_commands.add_parser(
        "resend",
        help="send the request a dead letter holds (key, value, headers as sent) to the topic it came from",
    )
    resending.add_argument(
        "--partition",
        metavar="P",
        type=partition,
        required=True,
        help="partition of the dead letter (timers watch shows it)",
    )
    resending.add_argument(
        "--offset", metavar="O", type=offset, required=True, help="offset of the dead letter"
    )
    resending.add_argument("--topic", help="the dead-letter topic (default: TIMERS_TOPIC_DLQ)")
    resending.add_argument(
        "--to", metavar="TOPIC", help="send it to this topic instead of its kt-source-topic"
    )
    resending.add_argument("--dry-run", action="store_true", help="say what would be sent, send nothing")
    resending.add_argument(
        "--json", action="store_true", help="print JSON (stable keys) instead of a sentence"
    )
    add_delivery_timeout(resending)
    resending.set_defaults(run=_resend)


def _add_admin(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin",
        metavar="URL",
        help="a worker's web URL; the others are found from it "
        f"(default: {ADMIN_URL_ENV}, else {DEFAULT_ADMIN_URL})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (stable keys) instead of a table")


def _admin(args: argparse.Namespace) -> AdminApi:
    return AdminApi(admin_url(args.admin, os.environ), token_from(os.environ))


def _warn_unreachable(client: AdminApi, prog: str) -> None:
    for url, why in sorted(client.unreachable.items()):
        print(f"{prog}: warning: left out {url}, named by another worker: {why}", file=sys.stderr)


def _list(args: argparse.Namespace) -> int:
    common = CommonConfig.from_env()
    if args.partition is not None and args.partition >= common.topics.partitions:
        raise UsageError(
            f"--partition {args.partition}: the request topic has partitions 0 to "
            f"{common.topics.partitions - 1} (TIMERS_PARTITIONS)",
            "timers list",
        )
    query: dict[str, object] = {}
    for name, at in (("from_ms", args.from_at), ("to_ms", args.to_at)):
        if at is not None:
            query[name] = round(at * 1000)
    if args.after is not None:
        query["after"] = args.after
    if args.partition is not None:
        query["partition"] = args.partition
    client = _admin(args)
    page = list_timers(client, query, args.limit, common.topics.partitions)
    if args.json:
        print_json(
            {
                "timers": page.timers,
                "next": page.next,
                "workers": page.workers,
                "missing_partitions": page.missing,
            }
        )
    else:
        columns = ["id", "partition", "due_ms", "callback_topic", "callback_key", "payload_bytes"]
        rows = [[shown_time(t.get(c)) if c == "due_ms" else t.get(c) for c in columns] for t in page.timers]
        print(table(["id", "partition", "due", "callback_topic", "callback_key", "payload_bytes"], rows))
        if page.next is not None:
            print(f"timers list: more after this page: --after {shlex.quote(page.next)}", file=sys.stderr)
    _warn_unreachable(client, "timers list")
    if page.missing:
        print(
            f"timers list: warning: no worker answered for partitions {', '.join(map(str, page.missing))}: "
            "their timers are not listed (a worker starting, or a rebalance under way)",
            file=sys.stderr,
        )
    return 0


def _show(args: argparse.Namespace) -> int:
    client = _admin(args)
    timer = show_timer(client, args.id, args.payload)
    _warn_unreachable(client, "timers show")
    if timer is None:
        print(
            f"timers show: {args.id!r} is not pending on any worker: unknown id, fired or cancelled",
            file=sys.stderr,
        )
        return EXIT_NOT_PENDING
    if args.json:
        print_json(timer)
    else:
        lines = [
            (name, shown_time(value) if name.endswith("due_ms") else value)
            for name, value in detail_lines(timer)
        ]
        print(table(["field", "value"], lines))
    return 0


def _status(args: argparse.Namespace) -> int:
    common = CommonConfig.from_env()
    client = _admin(args)
    group = os.environ.get("TIMERS_APP_ID") or DEFAULT_APP_ID
    status = cluster_status(client, common.topics.partitions, request_lag(common, group, kafka_log))
    if args.json:
        print_json(status)
    else:
        print(status_tables(status))
    _warn_unreachable(client, "timers status")
    return 0


def _resend(args: argparse.Namespace) -> int:
    common = CommonConfig.from_env()
    topic = args.topic or common.topics.dlq
    letter = resend.read_one(common, topic, args.partition, args.offset, args.delivery_timeout, kafka_log)
    try:
        record = resend.plan(letter, args.to)
    except resend.ResendError as exc:
        raise UsageError(str(exc), "timers deadletter resend") from exc
    callback_topic = resend.callback_topic_of(letter)
    if callback_topic is not None and resend.missing_topics(common, [callback_topic], 10.0, kafka_log):
        raise UsageError(
            f"the timer's callback topic {callback_topic!r} still does not exist: create it "
            f"(timers topics create --callback {callback_topic}), wait {TOPIC_REFRESH_S:g}s for the "
            "workers to see it, then resend",
            "timers deadletter resend",
        )
    if letter.reason == resend.BATCH_INVALID:
        print(
            "timers deadletter resend: warning: the valid timers of this batch were scheduled when it was "
            "first read: they are scheduled again (any that fired meanwhile fire again)",
            file=sys.stderr,
        )
    where = f"{topic}[{args.partition}]@{args.offset}"
    out: dict[str, Any] = {
        "dead_letter": {
            "topic": topic,
            "partition": args.partition,
            "offset": args.offset,
            "reason": letter.reason,
        },
        "to": {"topic": record.topic, "partition": None, "offset": None},
        "sent": False,
    }
    if args.dry_run:
        sentence = f"would resend {where} ({letter.reason}) to {record.topic}: nothing sent (--dry-run)"
    else:
        partition, offset = resend.send(common, record, args.delivery_timeout, kafka_log)
        out["to"].update(partition=partition, offset=offset)
        out["sent"] = True
        sentence = f"resent {where} ({letter.reason}) to {record.topic}[{partition}]@{offset}"
    if args.json:
        print_json(out)
    else:
        print(sentence)
    return 0
