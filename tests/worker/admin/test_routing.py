"""With two workers, each answers for the partitions it holds and names the worker holding the others."""

from __future__ import annotations

import time
import uuid

import pytest

from ktimers.broker import free_port
from tests.integration.conftest import WORKER_READY, Stack
from tests.worker.admin.conftest import AdminHttp, wait_for

pytestmark = pytest.mark.integration


def held(http: AdminHttp) -> list[int]:
    reply = http.get("/api/partitions")
    return [p["partition"] for p in reply.body["partitions"]] if reply.status == 200 else []


def located(timer_id: str, *workers: AdminHttp) -> list[int]:
    """The partition of the timer, from whichever worker holds it ([] while none does)."""
    replies = [w.get(f"/api/timers/{timer_id}") for w in workers]
    return [r.body["partition"] for r in replies if r.status == 200]


def test_each_worker_answers_for_its_partitions_and_points_to_the_other(admin_stack: Stack) -> None:
    first = AdminHttp(admin_stack.web_port)
    port = free_port()
    env = {
        **admin_stack.worker_env(),
        "TIMERS_DATA_DIR": str(admin_stack.data_dir.parent / "second-worker"),
        "TIMERS_WEB_PORT": str(port),
        "TIMERS_METRICS_PORT": str(free_port()),
    }
    second_worker = admin_stack.spawn("worker-b", ["-m", "futures.worker.main"], env)
    second = AdminHttp(port)
    try:
        second_worker.wait_for_output(WORKER_READY, timeout_s=60)
        wait_for(
            lambda: len(held(first)) == 2 and sorted(held(first) + held(second)) == [0, 1, 2, 3],
            timeout_s=60,
            what="the partitions split between the two workers",
        )
        mine, theirs = held(first), held(second)

        # One timer in each partition: schedule until every partition has one.
        ids: dict[int, str] = {}
        with admin_stack.client() as client:
            for _ in range(50):
                timer_id = f"route-{uuid.uuid4().hex[:8]}"
                client.schedule("cb-admin", "k", "v", delay=3600, id=timer_id)
                client.flush()
                found = wait_for(
                    lambda tid=timer_id: located(tid, first, second), timeout_s=10, what=f"{timer_id} found"
                )
                ids.setdefault(found[0], timer_id)
                if len(ids) == 4:
                    break
        assert sorted(ids) == [0, 1, 2, 3]

        for partition, timer_id in ids.items():
            owner, other = (first, second) if partition in mine else (second, first)
            assert owner.get(f"/api/timers/{timer_id}").status == 200
            reply = other.get(f"/api/timers/{timer_id}")
            assert reply.status == 404
            assert reply.body["elsewhere"] == {owner.base: sorted(mine if owner is first else theirs)}

        stats = first.get("/api/stats").body
        assert stats["elsewhere"] == {second.base: theirs}
        refused = first.get(f"/api/timers?partition={theirs[0]}")
        assert refused.status == 404 and refused.body["held_by"] == second.base
    finally:
        second_worker.stop()
        started = time.monotonic()
        wait_for(lambda: held(first) == [0, 1, 2, 3], timeout_s=60, what="the first worker holds all again")
        print(f"\ntakeover after the second worker stopped: {time.monotonic() - started:.1f}s")
