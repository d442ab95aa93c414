"""How big each measurement is: ``smoke`` (seconds, for the tests), ``quick`` (``make bench``,
under 5 minutes) and ``full`` (``make bench-full``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """Sizes of one run. Counts are timers or records; durations are seconds."""

    name: str
    #: Records through the confluent-kafka pass-through.
    ceiling_records: int
    #: Records drained by the bare Faust agent, and by the worker as single-timer requests.
    ingest_records: int
    #: Timers drained by the worker as batched requests (when the client has ``schedule_many``).
    batched_timers: int
    #: Timers due in the same second.
    hot_timers: int
    #: Timers due evenly over ``spread_window_s``.
    spread_timers: int
    spread_window_s: float
    #: Steady workloads (timers due per second), each for ``steady_duration_s``; the
    #: requests are sent ``steady_lead_s`` before their due time, while earlier ones fire.
    steady_rates: tuple[int, ...]
    steady_duration_s: float
    steady_lead_s: float
    #: Steady rates measured again with the worker in precise mode (``TIMERS_PRECISE=1``).
    precise_rates: tuple[int, ...]
    #: The sustained rate (``bench.sustained``): steady workloads (requests ``steady_lead_s``
    #: ahead) held ``sustained_hold_s`` each, from ``sustained_start`` timers per second up,
    #: at most ``sustained_steps`` rates per system.
    sustained_start: int
    sustained_hold_s: float
    sustained_steps: int
    #: Pending timers for the capacity measurement, and how many of them are due in
    #: one hot second at the end (fire throughput at that size).
    capacity_pending: int
    capacity_hot: int
    #: Longest a load through single-timer records may take before the size is scaled
    #: down (the batched path has no such cap).
    single_load_budget_s: float
    #: How long to wait for stragglers after the last due time, and for a drain.
    tail_timeout_s: float
    #: Time left between the planned end of a load and the first due time.
    load_margin_s: float
    #: Sample the worker with py-spy (top functions in the report), in a run of its own after the
    #: measured ones: its figures are not kept.
    profile_worker: bool


SMOKE = Profile(
    name="smoke",
    ceiling_records=2_000,
    ingest_records=1_000,
    batched_timers=2_000,
    hot_timers=500,
    spread_timers=300,
    spread_window_s=1.5,
    steady_rates=(100,),
    steady_duration_s=1.0,
    steady_lead_s=1.5,
    precise_rates=(300,),
    sustained_start=200,
    sustained_hold_s=2.0,
    sustained_steps=2,
    capacity_pending=2_000,
    capacity_hot=200,
    single_load_budget_s=5.0,
    tail_timeout_s=10.0,
    load_margin_s=1.0,
    profile_worker=True,
)

QUICK = Profile(
    name="quick",
    ceiling_records=300_000,
    # The ingest measure reads the worker's count every 0.2 s (bench/service.py): a second's
    # worth of single-Future records at ~100 k/s, so that several samples fall inside the rise.
    ingest_records=100_000,
    batched_timers=300_000,
    hot_timers=100_000,
    spread_timers=100_000,
    spread_window_s=20.0,
    steady_rates=(1_000, 10_000),
    steady_duration_s=12.0,
    steady_lead_s=5.0,
    precise_rates=(10_000,),
    sustained_start=10_000,
    sustained_hold_s=15.0,
    # Five: after 10 k, 20 k, 40 k and the middle of the last held and the first not held, one
    # more middle (20 k held, 40 k and 28 k not: 24 k), so the rate is known to within 20 %.
    sustained_steps=5,
    capacity_pending=1_000_000,
    capacity_hot=100_000,
    single_load_budget_s=30.0,
    tail_timeout_s=30.0,
    load_margin_s=2.0,
    profile_worker=True,
)

FULL = Profile(
    name="full",
    ceiling_records=2_000_000,
    ingest_records=100_000,
    batched_timers=2_000_000,
    hot_timers=1_000_000,
    spread_timers=1_000_000,
    spread_window_s=60.0,
    steady_rates=(1_000, 10_000),
    steady_duration_s=60.0,
    steady_lead_s=5.0,
    precise_rates=(1_000, 10_000),
    sustained_start=10_000,
    sustained_hold_s=60.0,
    sustained_steps=7,
    capacity_pending=10_000_000,
    capacity_hot=1_000_000,
    single_load_budget_s=300.0,
    tail_timeout_s=120.0,
    load_margin_s=3.0,
    profile_worker=True,
)

PROFILES = {p.name: p for p in (SMOKE, QUICK, FULL)}
