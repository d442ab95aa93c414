"""``python -m bench [--profile smoke|quick|full] [--repeat N] [--only PHASE,...]``: measure, then render
docs/BENCHMARKS.md."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench.cluster import REPO, run_dir
from bench.profiles import PROFILES
from bench.run import PHASES, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark kafka-timers against the pass-through ceiling, the Faust floor and the "
        "Redis sorted-set design, on the embedded broker or KAFKA_BOOTSTRAP_SERVERS.",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick", help="sizes (default: quick)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="docs directory: bench/results.json, bench/*.png and BENCHMARKS.md (default: docs; with "
        "--only, the work directory, so that a partial run never replaces the full report)",
    )
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated phases to run, in this order: {', '.join(PHASES)} (default: all)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every measurement N times; the report gives the median and the spread (default: 1)",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="logs, raw arrivals, worker data (default: run/bench-<time>)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    only = [phase.strip() for phase in args.only.split(",") if phase.strip()]
    unknown = sorted(set(only) - set(PHASES))
    if unknown or not only:
        parser.error(
            f"--only: unknown phase {', '.join(unknown) or '(none given)'}; pick from {', '.join(PHASES)}"
        )
    work = args.work or run_dir("bench")
    out = args.out or (REPO / "docs" if set(only) == set(PHASES) else work)
    command = "python -m bench " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    runs, pages = run(PROFILES[args.profile], out, work, command.strip(), args.repeat, only)
    minutes = sum(r.duration_s for r in runs) / 60
    print(f"written: {', '.join(map(str, pages))} ({minutes:.1f} min); logs and raw data: {work}", flush=True)
    errors = sum(len(r.errors) for r in runs)
    if errors:
        print(f"{errors} measurement(s) failed: see the report's Errors section", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
