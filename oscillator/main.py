"""Entry point: ``timers-oscillator`` or ``python -m oscillator.main``.

The command line is parsed first (``--help``/``--version`` stop there) and the
configuration read; :mod:`oscillator.service` runs it, imported only then: it needs
the ``oscillator`` extra, which ``--help`` does not.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ktimers.cli import EXIT_USAGE, Parser, command_parser, parse_args
from ktimers.config import SHARED_ENV
from ktimers.errors import ConfigError
from ktimers.shutdown import StopFlag
from oscillator.config import OSCILLATOR_ENV, OscillatorConfig

log = logging.getLogger("oscillator")


def build_parser() -> Parser:
    return command_parser(
        "timers-oscillator",
        "The oscillator: one tick a second to every partition of the oscillator topic, "
        "until SIGTERM/SIGINT.\nConfigured by the environment only.",
        [("environment, shared", SHARED_ENV), ("environment, oscillator", OSCILLATOR_ENV)],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parse_args(build_parser(), argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = StopFlag()
    stop.install()
    try:
        config = OscillatorConfig.from_env()
        # librdkafka would reject a CA bundle it cannot read only when the first client is made,
        # as a traceback: said now, in one line, as the worker says it.
        config.common.kafka.ssl_context()
    except ConfigError as exc:
        log.error("oscillator cannot start: %s", exc)
        return EXIT_USAGE
    logging.getLogger().setLevel(config.log_level)
    from oscillator.service import run

    return run(config, stop)


if __name__ == "__main__":
    sys.exit(main())
