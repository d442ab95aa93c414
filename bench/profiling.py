"""Where the worker's CPU goes during a measurement: py-spy, sampling from outside.

py-spy reads the worker's memory without pausing it (``--nonblocking``) at a low
rate; it only samples threads that are running, so the shares are of CPU time, not
of wall time. Its own CPU is taken from the machine the worker shares, so the
figures of a sampled run are not reported (:func:`bench.run.run` profiles a run of
its own).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from bench.results import ProfileSummary

#: Samples per second; ``BENCH_PYSPY_HZ`` raises it for a closer look at one phase.
RATE_HZ = int(os.environ.get("BENCH_PYSPY_HZ", "50"))
#: A hot second's firing lasts about a second: at the rate above, too few samples to rank.
BURST_RATE_HZ = max(RATE_HZ, 100)
TOP = 8
#: Frames of our code: py-spy names files relative to the repository, as `f (path:line)`.
OUR_PACKAGES = ("(futures/", "(ktimers/")
#: On every stack of the worker, so they say nothing: the entry point and the agents,
#: which only hand batches to the engine.
ENTRY_FILES = ("futures/worker/main.py", "futures/worker/agents.py")


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def summarize(raw: str, phase: str) -> ProfileSummary:
    """py-spy ``--format raw`` (``frame;frame;... count`` per line) → top functions by own samples."""
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        own[frames[-1]] += int(count)
        # Inclusive, per function (not per line), each counted once per stack.
        mine = {_function(f) for f in frames if any(p in f for p in OUR_PACKAGES)}
        ours.update(dict.fromkeys({f for f in mine if not any(e in f for e in ENTRY_FILES)}, int(count)))
        total += int(count)
    if not total:
        return ProfileSummary(phase=phase, samples=0)
    return ProfileSummary(
        phase=phase,
        samples=total,
        top_self=[(name, 100 * n / total) for name, n in own.most_common(TOP)],
        top_ours=[(name, 100 * n / total) for name, n in ours.most_common(TOP)],
    )


def _function(frame: str) -> str:
    """``f (path.py:12)`` → ``f (path.py)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


class Profiler:
    """Collects one :class:`ProfileSummary` per profiled phase (nothing when disabled)."""

    def __init__(self, enabled: bool, out_dir: Path) -> None:
        self.binary = py_spy() if enabled else None
        self.out_dir = out_dir
        self.summaries: list[ProfileSummary] = []
        self.problem = "" if self.binary or not enabled else "py-spy not found"

    def burst(self, pid: int, phase: str) -> Callable[[], AbstractContextManager[None]]:
        """A sampling of a hot second's firing, to enter when its load is in (``bench.fire.scheduled``)."""
        return functools.partial(self.sample, pid, phase, BURST_RATE_HZ)

    @contextlib.contextmanager
    def sample(self, pid: int, phase: str, rate_hz: int = RATE_HZ) -> Iterator[None]:
        if self.binary is None:
            yield
            return
        out = self.out_dir / f"profile-{phase}.txt"
        argv = [self.binary, "record", "--pid", str(pid), "--nonblocking", "--rate", str(rate_hz)]
        argv += ["--format", "raw", "--output", str(out)]
        log = self.out_dir / f"profile-{phase}.log"
        with open(log, "wb") as log_file:
            process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)  # noqa: S603
        try:
            yield
        finally:
            # py-spy writes its output when interrupted, as on Ctrl-C.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if out.exists():
                self.summaries.append(summarize(out.read_text(errors="replace"), phase))
            else:
                detail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                self.summaries.append(
                    ProfileSummary(phase=phase, samples=0, note=f"py-spy wrote nothing: {' '.join(detail)}")
                )
