"""Figures over repeated runs: the median of each, and its spread (min–max).

A figure is read from every run by a getter (``None`` when that run did not measure
it); a ratio is computed inside each run first (both sides from the same run, on the
same machine load), and only then is the median taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.results import Fire, Results, SustainedStep

Getter = Callable[[Results], float | None]
Format = Callable[[float], str]


@dataclass(frozen=True)
class Spread:
    """The values one figure took in the runs that measured it."""

    values: tuple[float, ...]

    @property
    def known(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float:
        return float(np.median(self.values)) if self.values else float("nan")

    @property
    def lo(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def hi(self) -> float:
        return max(self.values) if self.values else float("nan")

    def show(self, fmt: Format) -> str:
        """``median (min–max)``; the median alone from one run, ``—`` from none."""
        if not self.values:
            return "—"
        middle, lo, hi = fmt(self.median), fmt(self.lo), fmt(self.hi)
        return middle if len(self.values) == 1 or lo == hi else f"{middle} ({lo}–{hi})"


def spread(runs: Sequence[Results], get: Getter) -> Spread:
    values = []
    for r in runs:
        value = get(r)
        if value is not None and value == value:  # NaN: not measured
            values.append(float(value))
    return Spread(tuple(values))


def of_fire(system: str, workload: str, read: Callable[[Fire], float]) -> Getter:
    """A getter reading one figure of one fire workload."""

    def get(r: Results) -> float | None:
        fire = r.fire(system, workload)
        return read(fire) if fire is not None else None

    return get


def of_held(system: str, read: Callable[[SustainedStep], float]) -> Getter:
    """A getter reading one figure of the highest rate ``system`` sustained (None where none was held)."""

    def get(r: Results) -> float | None:
        found = r.sustained_of(system)
        held = found.held if found is not None else None
        return read(held) if held is not None else None

    return get


def held_rate(system: str) -> Getter:
    """The highest rate ``system`` sustained: 0 where it held none, None where it was not measured."""

    def get(r: Results) -> float | None:
        found = r.sustained_of(system)
        if found is None:
            return None
        return float(found.held.rate) if found.held is not None else 0.0

    return get


def ceiling_rate(r: Results) -> float | None:
    """The pass-through ceiling measured in run ``r`` (records per second)."""
    return r.ceiling.rate if r.ceiling else None


def ratio(top: Getter, bottom: Getter) -> Getter:
    """``top / bottom`` within each run (None where either is missing or the bottom is 0)."""

    def get(r: Results) -> float | None:
        a, b = top(r), bottom(r)
        return a / b if a is not None and b else None

    return get


def rate(value: float) -> str:
    return f"{value:,.0f}/s" if value else "—"


def ms(value: float) -> str:
    return "—" if value != value else f"{value:,.0f}"


def percent(value: float) -> str:
    return f"{100 * value:.1f} %"
