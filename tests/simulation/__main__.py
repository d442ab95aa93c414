"""``python -m tests.simulation``: run seeded simulations for as long as asked (``make simulate``).

Prints each run (seed, steps, callbacks, faults injected), the totals by fault kind, every
violation, and for the first failing seed the shortest schedule that still fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from tests.simulation.faults import KNOWN_HOLES, parse
from tests.simulation.run import run_schedule
from tests.simulation.schedule import generate
from tests.simulation.shrink import shrink
from tests.simulation.world import World


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="run for this long (wall clock)")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: from the time)")
    parser.add_argument("--steps", type=int, default=250, help="steps of each run")
    parser.add_argument(
        "--faults", default="default", help="default, all, or +name,-name,... (see docs/simulation.md)"
    )
    parser.add_argument(
        "--runs", type=int, default=0, help="stop after this many runs (0: only the time bounds)"
    )
    parser.add_argument("--no-shrink", action="store_true", help="do not shrink a failing schedule")
    args = parser.parse_args(argv)
    faults = parse(args.faults)
    seed = args.seed if args.seed is not None else int(time.time())
    holes = [f"{f.value} ({line})" for f, line in KNOWN_HOLES.items() if f in faults]
    print(f"faults: {', '.join(sorted(f.value for f in faults))}")
    print(f"known holes enabled: {'; '.join(holes) or 'none'}")
    started, runs, steps = time.monotonic(), 0, 0
    injected: Counter[str] = Counter()
    violations: Counter[str] = Counter()
    failed: list[tuple[int, set[str]]] = []
    while time.monotonic() - started < args.seconds and (args.runs == 0 or runs < args.runs):
        schedule = generate(seed, args.steps, faults, World.settle_time_s())
        outcome = run_schedule(schedule, faults, seed)
        runs, steps = runs + 1, steps + outcome.steps
        injected.update(outcome.injected)
        kinds = Counter(v.invariant for v in outcome.violations)
        violations.update(kinds)
        faults_injected = sum(outcome.injected.values())
        print(
            f"seed {seed}: {outcome.steps} steps, {outcome.callbacks} callbacks, {faults_injected} faults, "
            f"violations {dict(kinds) or 'none'}",
            flush=True,
        )
        for violation in outcome.violations[:5]:
            print(f"  {violation.invariant}: {violation.detail}")
        if outcome.failed:
            failed.append((seed, outcome.kinds()))
        seed += 1
    print(f"\n{runs} runs, {steps} steps in {time.monotonic() - started:.0f} s")
    print("faults injected: " + ", ".join(f"{k} {n}" for k, n in sorted(injected.items())))
    print("violations: " + (", ".join(f"{k} {n}" for k, n in sorted(violations.items())) or "none"))
    if not failed:
        return 0
    seed, broken = failed[0]
    print(f"\nfailing seeds: {[s for s, _ in failed]}")
    print(f"reproduce: make simulate SEED={seed} RUNS=1 STEPS={args.steps} FAULTS={args.faults}")
    if not args.no_shrink:
        schedule = generate(seed, args.steps, faults, World.settle_time_s())
        shortest, shrunk = shrink(schedule, faults, seed, broken, on_try=_progress)
        print(
            f"\nshortest schedule of seed {seed} that still fails ({len(shortest)} of {len(schedule)} steps):"
        )
        for step in shortest:
            print(f"  {step}")
        if shrunk is not None:
            for violation in shrunk.violations[:10]:
                print(f"  -> {violation.invariant}: {violation.detail}")
    return 1


def _progress(runs: int, length: int) -> None:
    print(f"  shrinking: try {runs}, {length} steps", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
