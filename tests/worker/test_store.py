"""Where a worker resumes reading requests: from its table's progress, not Faust's commits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from faust.types import TP

from futures.worker.app import create_app
from futures.worker.config import WorkerConfig
from futures.worker.table import progress_record


def test_resume_positions_follow_the_tables_progress(tmp_path: Path) -> None:
    config = WorkerConfig.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path), "TIMERS_APP_ID": "t"}
    )
    timers = create_app(config, partitions=4)
    store = timers.store
    request = config.common.topics.request
    changelog = config.changelog_topic
    assigned = {TP(changelog, 0), TP(changelog, 1), TP(request, 0), TP(request, 1), TP("oscillator", 0)}
    asyncio.run(store.on_rebalance(assigned, set(), assigned))

    # Partition 0 applied requests up to offset 41; partition 1 never applied one.
    store.partition(0).apply([progress_record(1_800_000_000, 41)], offset=7)
    store.partition(2).apply([progress_record(1_800_000_000, 99)], offset=3)  # not assigned here

    everything = assigned | {TP(request, 2)}
    assert store.resume_positions(everything) == {TP(request, 0): 42}
    store.reset_state()
