"""``timers topics create|check``: create the service's topics, or check their layout."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from futures.console import connect
from futures.console.options import positive_int
from ktimers.topics import create_topics, verify_topics


def add_parser(commands: Any) -> None:
    """Add ``topics`` and its actions to the subparsers ``commands``."""
    topics = commands.add_parser("topics", help="create or check the service's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    create = topic_commands.add_parser("create", help="create missing topics, then check the layout")
    create.add_argument(
        "--partitions", type=positive_int, help="partition count (default: TIMERS_PARTITIONS)"
    )
    create.add_argument(
        "--callback",
        action="append",
        default=[],
        metavar="TOPIC",
        help="also create this callback topic (repeatable): the worker never creates one itself",
    )
    create.set_defaults(run=_create)
    check = topic_commands.add_parser("check", help="check the topics exist and are co-partitioned")
    check.set_defaults(run=_check)


def _create(args: argparse.Namespace) -> int:
    common = connect.common()
    if args.partitions is not None:
        common = replace(common, topics=replace(common.topics, partitions=args.partitions))
    connect.probe(common)
    created = create_topics(common, callback_topics=args.callback)
    print(f"created: {', '.join(created)}" if created else "all topics already exist")
    print(f"ok: {', '.join(connect.service_topics(common))} are ready")
    return 0


def _check(args: argparse.Namespace) -> int:
    common = connect.common()
    partitions = verify_topics(common, admin=connect.probe(common))
    print(f"ok: {', '.join(connect.service_topics(common))} exist with {partitions} partitions each")
    return 0
