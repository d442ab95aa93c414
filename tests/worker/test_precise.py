"""Precise mode: on tick s, the timers due by s + 1 go out each at its own millisecond."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from futures.ingress.records import SourceRecord
from futures.worker.config import WorkerConfig
from futures.worker.engine import wall_clock_ms
from futures.worker.table import table_key
from ktimers.config import CommonConfig, KafkaConfig
from ktimers.wire import TimerEvent
from tests.protobuf_bytes import UNKNOWN_FIELDS, unknown_fields_future
from tests.worker.rig import Rig

Kind = TimerEvent.Kind


class WallClockRig(Rig):
    """The engine sleeps until due times here, so its clock is the real one."""

    @property  # type: ignore[override]
    def now(self) -> int:
        return wall_clock_ms()

    @now.setter
    def now(self, value: int) -> None:
        pass


async def _early_in_a_second() -> int:
    """Wait for the first tenth of a second (so the window is that second's); the epoch second."""
    while wall_clock_ms() % 1000 > 100:
        await asyncio.sleep(0.01)
    return wall_clock_ms() // 1000


def _run(rig: Rig, scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``scenario`` on a fresh event loop, then close ``rig``'s tables whatever happened."""
    try:
        asyncio.run(scenario())
    finally:
        rig.close()


async def _sleep_until(ms: int) -> None:
    await asyncio.sleep(max(ms - wall_clock_ms(), 0) / 1000)


def test_timers_go_out_at_their_millisecond_and_a_cancel_still_wins(tmp_path: Path) -> None:
    rig = WallClockRig(tmp_path, WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True))
    engine = rig.engine

    async def scenario() -> None:
        while wall_clock_ms() % 1000 > 100:  # start early in a second: the window is that second
            await asyncio.sleep(0.01)
        s = wall_clock_ms() // 1000
        base = s * 1000
        due = {"at-300": base + 300, "at-600": base + 600, "at-900": base + 900, "next": base + 1500}
        due["cancelled"] = base + 700
        await engine.ingest([rig.request(i, d) for i, d in due.items()])
        await rig.fire([rig.tick_record(s)])  # opens the window (s, s + 1]

        await _sleep_until(base + 450)
        await engine.ingest([rig.cancel("cancelled"), rig.cancel("at-300")])

        await _sleep_until(base + 1020)
        await rig.fire([rig.tick_record(s + 1)])  # waits for the window, then opens the next

        sent = {cb.header("kt-id").decode(): int(cb.header("kt-fired-ms")) for cb in rig.callbacks()}  # type: ignore[union-attr]
        assert set(sent) == {"at-300", "at-600", "at-900"}
        for timer_id, fired_ms in sent.items():
            assert fired_ms >= due[timer_id], f"{timer_id} early"
            # Sent at its own millisecond, not at the next tick (that would be up to 700 ms).
            assert fired_ms - due[timer_id] < 250, f"{timer_id} {fired_ms - due[timer_id]} ms late"
        assert [e.id for e in rig.events(Kind.CANCELLED)] == ["cancelled"]
        # "at-300" was already out when its cancel came: a miss, as without precise mode.
        assert [e.id for e in rig.events(Kind.CANCEL_MISSED)] == ["at-300"]
        # Deleted after they were sent; the next second's timer is pending (and now held).
        assert rig.pending_ids() == ["next"]
        assert rig.table(0).pending == 1
        assert rig.table(0).watermark == s + 1

    _run(rig, scenario)


def test_without_precise_mode_timers_wait_for_the_tick(tmp_path: Path) -> None:
    rig = WallClockRig(tmp_path, WorkerConfig(common=CommonConfig(kafka=KafkaConfig())))

    async def scenario() -> None:
        s = wall_clock_ms() // 1000
        await rig.engine.ingest([rig.request("soon", s * 1000 + 999)])
        await rig.fire([rig.tick_record(s)])
        await asyncio.sleep(1.1)
        assert rig.callbacks() == []
        await rig.fire([rig.tick_record(s + 1)])
        assert [cb.header("kt-id") for cb in rig.callbacks()] == [b"soon"]

    _run(rig, scenario)


def _precise_rig(tmp_path: Path) -> WallClockRig:
    return WallClockRig(tmp_path, WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True))


def _sent(rig: Rig) -> dict[str, list[int]]:
    sent: dict[str, list[int]] = {}
    for cb in rig.callbacks():
        sent.setdefault((cb.header("kt-id") or b"").decode(), []).append(int(cb.header("kt-fired-ms") or 0))
    return sent


def test_a_late_tick_delays_no_timer_the_window_a_second_ahead_holds(tmp_path: Path) -> None:
    rig = _precise_rig(tmp_path)
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        due = {"next-100": (s + 1) * 1000 + 100, "next-400": (s + 1) * 1000 + 400}
        await engine.ingest([rig.request(i, d) for i, d in due.items()])
        await rig.fire([rig.tick_record(s)])  # opens windows s + 1 and s + 2
        # The tick of s + 1 comes 700 ms late (it waited behind ingest, or in the broker).
        await _sleep_until((s + 1) * 1000 + 700)
        await rig.fire([rig.tick_record(s + 1)])

        sent = _sent(rig)
        assert set(sent) == set(due)
        for timer_id, [fired_ms] in sent.items():
            assert fired_ms >= due[timer_id], f"{timer_id} early"
            assert fired_ms - due[timer_id] < 150, f"{timer_id} {fired_ms - due[timer_id]} ms late"

    _run(rig, scenario)


def test_a_timer_accepted_after_its_window_opened_joins_it_and_a_new_version_replaces_it(
    tmp_path: Path,
) -> None:
    rig = _precise_rig(tmp_path)
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        base = s * 1000
        await engine.ingest([rig.request("moved", base + 500)])
        await rig.fire([rig.tick_record(s - 1)])  # opens windows s and s + 1

        await _sleep_until(base + 200)
        # 400 ms ahead: its window is open already, it joins it. "moved" gets a new due time.
        await engine.ingest([rig.request("short-lead", base + 600), rig.request("moved", base + 800)])
        await _sleep_until(base + 1050)
        await rig.fire([rig.tick_record(s)])

        sent = _sent(rig)
        assert sorted(sent) == ["moved", "short-lead"]
        assert len(sent["moved"]) == 1, "the replaced version was sent too"
        for timer_id, due in (("short-lead", base + 600), ("moved", base + 800)):
            [fired_ms] = sent[timer_id]
            assert fired_ms >= due, f"{timer_id} early"
            assert fired_ms - due < 150, f"{timer_id} {fired_ms - due} ms late (left for the tick?)"
        assert rig.pending_ids() == []

    _run(rig, scenario)


def test_a_window_larger_than_a_scan_slice_sends_every_timer_once_at_its_millisecond(tmp_path: Path) -> None:
    # A window's opening scan reads in slices (the open windows send between them): the
    # slices must join up, nothing read twice or skipped.
    rig = _precise_rig(tmp_path)
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        window = (s + 2) * 1000
        due = {f"t{i:04d}": window - 999 + (i * 7) % 999 for i in range(1_000)}
        await engine.ingest([rig.request(i, d) for i, d in due.items()])
        await rig.fire([rig.tick_record(s)])  # opens windows s + 1 and s + 2
        opened = wall_clock_ms()  # on a busy machine, maybe after some of them were due
        await _sleep_until(window + 50)
        await rig.fire([rig.tick_record(s + 1)])
        await rig.fire([rig.tick_record(s + 2)])

        sent = _sent(rig)
        assert set(sent) == set(due)
        assert all(len(times) == 1 for times in sent.values()), "a timer went out twice"
        assert min(fired - due[timer_id] for timer_id, [fired] in sent.items()) >= 0, "early"
        # Sent by the window (within its second), not left for the tick after it.
        waited = max(fired - max(due[timer_id], opened) for timer_id, [fired] in sent.items())
        assert waited < 250, f"{waited} ms after due or the window's opening (left for the tick?)"
        assert rig.pending_ids() == []

    _run(rig, scenario)


def test_a_window_waits_for_requests_written_a_second_before_its_second(tmp_path: Path) -> None:
    # The worker is behind on requests: a cancel written more than a second before the second
    # its timer is due in is still to be applied when the timer's millisecond comes. The window
    # waits for it.
    rig = WallClockRig(tmp_path, WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True))
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        base = s * 1000
        await engine.ingest([rig.request("cancelled", base + 300), rig.request("kept", base + 350)])
        await rig.fire([rig.tick_record(s)])
        rig.frontier.behind[0] = base - 1500  # requests written from base - 1500 on are not applied yet

        await _sleep_until(base + 500)
        assert rig.callbacks() == []  # both due, both waiting for the older requests
        await engine.ingest([rig.cancel("cancelled")])
        del rig.frontier.behind[0]

        await _sleep_until(base + 1020)
        await rig.fire([rig.tick_record(s + 1)])
        assert [cb.header("kt-id") for cb in rig.callbacks()] == [b"kept"]
        assert [e.id for e in rig.events(Kind.CANCELLED)] == ["cancelled"]

    _run(rig, scenario)


def test_windows_hold_no_more_bytes_than_their_share_of_the_budget_and_still_send_each_on_time(
    tmp_path: Path,
) -> None:
    budget = 1024 * 1024  # windows: three quarters, about seven callbacks of 100 KB
    config = WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True, fire_budget_bytes=budget)
    rig = WallClockRig(tmp_path, config)
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        base = s * 1000
        due = {f"big-{i}": base + 1500 + 20 * i for i in range(12)}
        await engine.ingest([rig.request(t, d, payload=b"x" * 100_000) for t, d in due.items()])
        gauge = engine._precise.windows.gauge  # type: ignore[union-attr]
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, gauge.used)
                await asyncio.sleep(0.001)

        watching = asyncio.create_task(watch())
        await rig.fire([rig.tick_record(s)])  # opens windows s + 1 and s + 2
        await _sleep_until(base + 2020)
        await rig.fire([rig.tick_record(s + 1)])
        watching.cancel()
        sent = {cb.header("kt-id").decode(): int(cb.header("kt-fired-ms")) for cb in rig.callbacks()}  # type: ignore[union-attr]
        assert sorted(sent) == sorted(due)
        # What did not fit was read from the table as sent timers freed their bytes: each
        # went out at its own millisecond, none with the tick (half a second later).
        assert all(0 <= sent[t] - due[t] < 100 for t in due), {t: sent[t] - due[t] for t in due}
        assert 0 < most <= budget * 3 // 4 + 101_000  # and one callback read past it
        assert gauge.used == 0

    _run(rig, scenario)


def test_a_window_waits_for_older_requests_at_most_the_bound_in_all(tmp_path: Path) -> None:
    # The older requests never come: the window's timers go once the window has waited
    # TIMERS_JOIN_MAX_WAIT_S, all of them, not that long again for each.
    config = WorkerConfig(common=CommonConfig(kafka=KafkaConfig()), precise=True, join_max_wait_s=0.3)
    rig = WallClockRig(tmp_path, config)
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        base = s * 1000
        due = {f"t{i}": base + 300 + 10 * i for i in range(3)}
        await engine.ingest([rig.request(t, d) for t, d in due.items()])
        await rig.fire([rig.tick_record(s)])
        rig.frontier.behind[0] = base - 5000  # and it stays behind
        await _sleep_until(base + 1020)
        await rig.fire([rig.tick_record(s + 1)])  # waits for the window to settle
        sent = {
            (cb.header("kt-id") or b"").decode(): int(cb.header("kt-fired-ms") or 0) for cb in rig.callbacks()
        }
        assert set(sent) == set(due)
        assert all(sent[t] - due[t] < 550 for t in due), sent  # 300 ms once, not once per timer
        assert rig.metrics.registry.get_sample_value("timers_join_wait_bound_total") == 1

    _run(rig, scenario)


def test_a_tick_that_comes_while_the_one_before_waits_for_the_engine_sends_nothing_twice(
    tmp_path: Path,
) -> None:
    # Tick s + 1 waits for the engine (an ingest step holds it) and, meanwhile, tick s + 2
    # comes: window s + 2 has sent its timers and waits for the engine to delete them. The
    # firing that claims s + 2 must wait for that window too, not scan its timers again.
    rig = _precise_rig(tmp_path)
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        due = {f"t{i}": (s + 1) * 1000 + 100 * i for i in range(1, 10)}  # window s + 2's
        await engine.ingest([rig.request(t, d) for t, d in due.items()])
        await rig.fire([rig.tick_record(s)])  # opens windows s + 1 and s + 2
        await _sleep_until((s + 1) * 1000 + 50)
        async with rig.lock:  # an ingest step under way
            firing = asyncio.create_task(rig.fire([rig.tick_record(s + 1)]))
            await _sleep_until((s + 2) * 1000 + 50)
            engine.note_ticks([rig.tick_record(s + 2)])
        await firing
        await engine.fire_ready()

        sent = _sent(rig)
        assert set(sent) == set(due)
        twice = {t: times for t, times in sent.items() if len(times) > 1}
        assert not twice, f"sent more than once: {twice}"
        assert rig.pending_ids() == []
        assert rig.table(0).watermark == s + 2

    _run(rig, scenario)


def test_a_stored_timer_no_callback_can_be_built_from_is_dead_lettered_alone_and_its_window_sends(
    tmp_path: Path,
) -> None:
    rig = _precise_rig(tmp_path)
    engine = rig.engine

    async def scenario() -> None:
        s = await _early_in_a_second()
        due = {name: (s + 1) * 1000 + 200 + 100 * i for i, name in enumerate(["a", "bad", "c", "d"])}
        await engine.ingest([rig.request(t, d) for t, d in due.items()])
        bad_key = table_key(due["bad"], "bad")
        rig.table(0).apply([(bad_key, b"\x0a\x05ab")], offset=None)  # bytes protobuf does not read
        await rig.fire([rig.tick_record(s)])  # opens windows s + 1 and s + 2
        await _sleep_until((s + 2) * 1000 + 50)
        await rig.fire([rig.tick_record(s + 1)])
        await rig.fire([rig.tick_record(s + 2)])  # its scan finds what window s + 2 left

        sent = _sent(rig)
        assert set(sent) == {"a", "c", "d"}
        for timer_id, [fired_ms] in sent.items():
            assert 0 <= fired_ms - due[timer_id] < 150, f"{timer_id} {fired_ms - due[timer_id]} ms late"
        (letter,) = rig.dlq()
        assert (letter.key, letter.header("kt-reason")) == (b"bad", b"unreadable-timer")
        assert [e.id for e in rig.events(Kind.REJECTED)] == ["bad"]
        assert bad_key in [key for key, _ in rig.deletions()]
        assert rig.pending_ids() == []

    _run(rig, scenario)


def test_futures_with_unknown_fields_of_any_wire_type_go_out_at_their_millisecond(tmp_path: Path) -> None:
    # Stored before their window opened (read by it) and accepted while it is open (joining it).
    rig = _precise_rig(tmp_path)
    engine = rig.engine
    extras = list(UNKNOWN_FIELDS.items())

    async def scenario() -> None:
        s = await _early_in_a_second()
        base = (s + 1) * 1000
        due = {f"read-{name}": base + 300 + 10 * i for i, (name, _) in enumerate(extras)}
        due |= {f"joined-{name}": base + 600 + 10 * i for i, (name, _) in enumerate(extras)}

        def records(prefix: str) -> list[SourceRecord]:
            return [
                rig.raw_request(
                    None, unknown_fields_future(f"{prefix}-{name}", due[f"{prefix}-{name}"], extra)
                )
                for name, extra in extras
            ]

        await engine.ingest(records("read"))
        await rig.fire([rig.tick_record(s)])  # opens windows s + 1 and s + 2
        await _sleep_until(base + 100)
        await engine.ingest(records("joined"))
        await _sleep_until((s + 2) * 1000 + 50)
        await rig.fire([rig.tick_record(s + 1)])
        await rig.fire([rig.tick_record(s + 2)])

        sent = _sent(rig)
        assert set(sent) == set(due)
        for timer_id, [fired_ms] in sent.items():
            assert 0 <= fired_ms - due[timer_id] < 150, f"{timer_id} {fired_ms - due[timer_id]} ms late"
        for callback in rig.callbacks():
            timer_id = (callback.header("kt-id") or b"").decode()
            assert (callback.key, callback.value) == (
                f"key-{timer_id}".encode(),
                f"payload-{timer_id}".encode(),
            )
            assert (callback.header("h"), callback.header("kt-token")) == (b"v", b"tok")
        assert rig.dlq() == []
        assert rig.pending_ids() == []

    _run(rig, scenario)
