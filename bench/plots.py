"""The plots of ``docs/BENCHMARKS.md``: lateness distributions, fire rate over time, the hot second.

Distributions and rates over time show the first run; the hot-second plot shows all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI or servers

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
import numpy as np  # noqa: E402

from bench.results import DIRECT, OURS, REDIS, REDIS_AOF, Fire, Results, first_fire, workload_title  # noqa: E402

Runs = Sequence[Results]

COLORS = {OURS: "tab:blue", REDIS: "tab:red", REDIS_AOF: "tab:orange", DIRECT: "tab:gray"}
#: In plots, our precise mode apart from our second mode.
PRECISE_COLOR = "tab:green"
HOT_PLOT = "hot-second.png"
#: Buckets of the hot-second plot (seconds).
HOT_BUCKET_S = 0.1


def _color(fire: Fire) -> str | None:
    return PRECISE_COLOR if fire.workload.startswith("precise") else COLORS.get(fire.system)


def _per_workload(
    r: Results, path: Path, draw: Callable[[Any, Fire], None], xlabel: str, ylabel: str, legend: str
) -> None:
    """One panel per workload of ``r``, each system drawn on it by ``draw(axes, fire)``."""
    workloads = list(dict.fromkeys(f.workload for f in r.fires))
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 2.6 * max(len(workloads), 1)), squeeze=False)
    for ax, workload in zip(axes[:, 0], workloads, strict=True):
        fires = [f for f in r.fires if f.workload == workload]
        for fire in fires:
            draw(ax, fire)
        ax.set_title(workload_title(fires[0]), fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc=legend, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_lateness(r: Results, path: Path) -> None:
    def draw(ax: Any, fire: Fire) -> None:
        if fire.arrivals is None or fire.arrivals.count == 0:
            return
        late = np.sort(fire.arrivals.received_ms - fire.arrivals.due_ms)
        share = np.arange(1, late.size + 1) / late.size
        ax.plot(late, share, color=_color(fire), label=f"{fire.system}")
        ax.axvline(fire.lateness.p99_ms, color=_color(fire), linestyle=":", linewidth=1)

    _per_workload(
        r, path, draw, "lateness: received − due (ms); dotted: p99", "share of timers", "lower right"
    )


def plot_fire_rate(r: Results, path: Path) -> None:
    def draw(ax: Any, fire: Fire) -> None:
        if fire.series_t:
            ax.step(fire.series_t, fire.series_rate, where="post", color=_color(fire), label=fire.system)

    xlabel = "seconds since the first timers became due (hot second: its tick)"
    _per_workload(r, path, draw, xlabel, "callbacks/s", "upper right")


#: The hot-second plot: (system, workload, label) of each line.
HOT_LINES = (
    (OURS, "hot-second", "kafka-timers"),
    (OURS, "precise-hot-second", "kafka-timers, precise mode"),
    (REDIS, "hot-second", "redis-zset (in memory)"),
    (REDIS_AOF, "hot-second", "redis-zset-aof (durable)"),
)


def plot_hot_second(runs: Runs, path: Path) -> None:
    """Callbacks per 100 ms against time after the hot second's due time, every run."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for system, workload, label in HOT_LINES:
        for index, r in enumerate(runs):
            fire = r.fire(system, workload)
            if fire is None or not fire.series_t:
                continue
            per_bucket = [v * HOT_BUCKET_S for v in fire.series_rate]
            color = PRECISE_COLOR if workload.startswith("precise") else COLORS.get(system)
            ax.step(fire.series_t, per_bucket, where="post", color=color, alpha=0.9 if index == 0 else 0.45,
                    label=label if index == 0 else None)  # fmt: skip
    size = first_fire(runs, OURS, "hot-second") or first_fire(runs, REDIS, "hot-second")
    runs_note = f", {len(runs)} runs (run 1 darker)" if len(runs) > 1 else ""
    ax.set_title(
        f"Hot second: {size.timers if size else 0:,} timers due in one second{runs_note}", fontsize=10
    )
    ax.set_xlabel("seconds after due (0: the end of the due second, the tick that fires it)")
    ax.set_ylabel(f"callbacks per {HOT_BUCKET_S * 1000:.0f} ms")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def draw(runs: Runs, directory: Path) -> None:
    """The plots docs/BENCHMARKS.md shows, into ``directory``: from the raw arrivals, so while measuring."""
    directory.mkdir(parents=True, exist_ok=True)
    if runs[0].fires:
        plot_lateness(runs[0], directory / "lateness.png")
        plot_fire_rate(runs[0], directory / "fire-rate.png")
    if any(r.fires for r in runs):
        plot_hot_second(runs, directory / HOT_PLOT)
