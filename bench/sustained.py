"""The sustained rate: the highest steady schedule rate a system holds, scheduling and firing at once.

A rate is tried as a steady workload (:func:`bench.fire.steady_rate`): timers due at that rate
for the hold, each requested the profile's ``steady_lead_s`` ahead, so the system accepts and
fires the whole time. The rate is *held* when every callback came back, none early, the p99
lateness at the receiver stayed within :data:`P99_LIMIT_MS` (second mode), and the timers due
at the end of the hold were no later than those due at its start, give or take
:data:`GROWTH_LIMIT_MS` (a backlog that grows would break the limit in a longer hold).

The search doubles the rate from the profile's start until one is not held, then tries the
geometric middle of the highest held and the lowest not held, until they are within
:data:`RESOLUTION` of each other or the profile's number of steps is used up. Every step
holds for the full hold: the rate reported was held for that long, not extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from bench.fire import FireContext, System, steady_rate
from bench.results import Fire, Sustained, SustainedStep
from bench.stats import lateness_growth

#: p99 lateness at the receiver a held rate stays within (ms): a second-mode timer waits up to
#: the one-second tick, so this leaves the tick's delay and the dispatch 100 ms.
P99_LIMIT_MS = 1100.0
#: Most the lateness may rise from the first due second of a hold to the last (ms).
GROWTH_LIMIT_MS = 200.0
#: Each rate tried while none has failed is this many times the one before.
RAMP = 2.0
#: The search stops once the lowest rate not held is within this share above the highest held.
RESOLUTION = 0.15


def round_rate(rate: float) -> int:
    """``rate`` to two significant digits (at least 1), so the rates tried read as what they are."""
    if rate < 10:
        return max(1, round(rate))
    scale = 10 ** (int(math.log10(rate)) - 1)
    return int(round(rate / scale) * scale)


def next_rate(tried: Sequence[tuple[int, bool]], start: int) -> int | None:
    """The rate to try after ``tried`` ((rate, held) in order), or None when the search is done."""
    if not tried:
        return start
    held = max((rate for rate, ok in tried if ok), default=0)
    above = [rate for rate, ok in tried if not ok and rate > held]
    if not above:
        return round_rate(held * RAMP)
    failed = min(above)
    if held == 0:
        lower = round_rate(failed / RAMP)
        return lower if lower < failed else None
    if failed <= held * (1 + RESOLUTION):
        return None
    middle = round_rate(math.sqrt(held * failed))
    return middle if held < middle < failed else None


def judge(rate: int, fire: Fire) -> SustainedStep:
    """Whether ``fire``, a steady workload at ``rate`` per second, held (see the module's text).

    When it did not, the reason lists what broke and the workload's notes (callbacks missing or
    early, a load generator that fell behind its schedule).
    """
    late = fire.lateness
    growth = 0.0
    if fire.arrivals is not None:
        growth = lateness_growth(fire.arrivals.due_ms, fire.arrivals.received_ms)
    reasons = []
    if late.received and late.p99_ms > P99_LIMIT_MS:
        reasons.append(f"p99 {late.p99_ms:,.0f} ms > {P99_LIMIT_MS:,.0f} ms")
    if growth > GROWTH_LIMIT_MS:
        reasons.append(f"backlog growing: lateness +{growth:,.0f} ms from the first due second to the last")
    if reasons or late.missing or late.early:
        why = "; ".join([*reasons, *fire.notes]) or f"{late.missing:,} missing, {late.early:,} early"
        return SustainedStep(rate, fire, growth, why)
    return SustainedStep(rate, fire, growth)


def measure(
    result: Sustained,
    ctx: FireContext,
    system: System,
    *,
    start: int,
    lead_s: float,
    steps: int,
    say: Callable[[str], None],
) -> None:
    """Search ``system``'s sustained rate in at most ``steps`` steady workloads of ``result.hold_s``
    seconds, each step added to ``result`` as it ends: a step that fails to run loses none before it."""
    hold_s = result.hold_s
    rate: int | None = start
    while rate is not None and len(result.steps) < steps:
        fire = steady_rate(ctx, system, f"sustained-{rate}", rate, hold_s, lead_s)
        step = judge(rate, fire)
        # Only the figures are kept: a full profile's raw arrivals run to millions of rows.
        fire.arrivals = None
        result.steps.append(step)
        late = fire.lateness
        say(
            f"  {system.name} sustained {rate:,}/s: {late.received:,}/{late.expected:,} received, "
            f"p50 {late.p50_ms:,.0f} p99 {late.p99_ms:,.0f} ms, growth {step.growth_ms:+,.0f} ms: "
            + (f"not held ({step.failed})" if step.failed else "held")
        )
        rate = next_rate([(s.rate, not s.failed) for s in result.steps], start)
