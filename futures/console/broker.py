"""``timers broker``: run only the embedded broker (Tansu, memory only), for trying things out."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from futures.console import connect
from futures.console.options import port
from ktimers.config import CommonConfig
from ktimers.errors import TimersError
from ktimers.shutdown import StopFlag
from ktimers.topics import create_topics


def add_parser(commands: Any) -> None:
    """Add ``broker`` to the subparsers ``commands``."""
    broker = commands.add_parser(
        "broker",
        help="run only the embedded broker (Tansu, memory only: for trying things out); Ctrl-C stops it",
    )
    broker.add_argument(
        "--port", type=port, default=9092, help="port on 127.0.0.1 (default 9092; 0: any free port)"
    )
    broker.add_argument("--no-topics", action="store_true", help="do not create the service's topics")
    broker.set_defaults(run=_broker)


def _broker(args: argparse.Namespace) -> int:
    # Imported here: the embedded broker is the `embedded` extra, not the client's install.
    from ktimers.broker import start_broker

    stop = StopFlag()
    stop.install()
    broker = start_broker(port=args.port or None)
    try:
        env = broker.env()
        print(f"embedded broker (Tansu, memory only) listening on {broker.bootstrap_servers}")
        if not args.no_topics:
            common = CommonConfig.from_env({**os.environ, **env})
            create_topics(common)
            print(f"topics: {', '.join(connect.service_topics(common))}")
        print("point clients and services at it (paste in another shell):")
        print("  export " + " ".join(f"{name}={value}" for name, value in env.items()))
        print("Ctrl-C stops it; everything it holds is lost.", flush=True)
        while not stop.requested:
            if broker.process.poll() is not None:
                raise TimersError(f"the embedded broker exited with status {broker.process.returncode}")
            time.sleep(0.2)
        print(f"stopping ({stop.reason})", flush=True)
        return 0
    finally:
        broker.stop()
