# The compiled module's types (staging.pyx).
from futures.worker.changelog import Changes
from futures.worker.columns import Timers
from futures.worker.windows import Windows

STAGED: int
REFUSE: int
PAUSE: int

def stage(
    timers: Timers,
    in_table: list[int | None],
    start: int,
    changes: Changes,
    windows: Windows | None,
    partition: int,
    late_ms: int,
    now_ms: int,
    max_lateness_s: float,
    refuse_late: bool,
    staged: int,
    pause_every: int,
) -> tuple[int, int, int, bool, int]: ...
