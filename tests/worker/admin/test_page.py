"""The admin page in headless Chromium: type the token, find a timer, see its payload, cancel it.

Playwright drives Debian's ``/usr/bin/chromium`` (``make browser`` installs it);
Playwright's own browser download is never used. Screenshots go to the test's
``tmp_path``; set ``ADMIN_SCREENSHOT_TO=docs/admin.png`` to also refresh the README's.
"""

from __future__ import annotations

import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ktimers.wire import TimerEvent
from tests.integration.conftest import OSCILLATOR_READY, Stack
from tests.worker.admin.conftest import ADMIN_TOKEN, STALL_AFTER_S, wait_for

pytestmark = pytest.mark.integration

CHROMIUM = Path(os.environ.get("TIMERS_CHROMIUM", "/usr/bin/chromium"))
CANCEL_AFTER_S = 15  # the cancelled timer's delay: time enough to load the page and click


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing and this test cannot install it: run `make browser` (apt-get chromium)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield chromium
        chromium.close()


def test_page_finds_a_timer_and_cancels_it_so_it_never_fires(
    admin_stack: Stack, browser: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    reader = admin_stack.callback_topic("admin-page")
    run = uuid.uuid4().hex[:6]
    victim = f"invoice-reminder-{run}"
    soon = [f"retry-{run}-{i}" for i in range(8)]
    with admin_stack.client() as client:
        handle = client.schedule(reader.topic, "invoice-17", "remind", delay=CANCEL_AFTER_S, id=victim)
        # Company on the page: callbacks firing now (recent firings, lateness), timers over the hour.
        for i, timer_id in enumerate(soon):
            client.schedule(reader.topic, f"order-{i}", "retry", delay=1 + i * 0.4, id=timer_id)
        for i in range(60):
            client.schedule(
                "cb-admin", f"user-{i}", "nudge", delay=random.uniform(60, 3600), id=f"nudge-{run}-{i}"
            )
        # and one the worker dead-letters: Kafka's internal topics never receive callbacks.
        client.schedule("__consumer_offsets", "x", "refused", delay=1, id=f"refused-{run}")

    page = browser.new_page(viewport={"width": 1440, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"http://127.0.0.1:{admin_stack.web_port}/admin/")
    # Without a token the page shows clocks and counts, and asks for the token for timers.
    expect(page.locator("#timers tbody")).to_contain_text("type the admin token")
    expect(page.locator("#firings tbody")).to_contain_text("type the admin token")
    expect(page.locator("#partitions tbody tr")).to_have_count(4)
    page.fill("#token", ADMIN_TOKEN)

    # The scheduled timer is in the pending list, and search by id opens it.
    row = page.locator(f'#timers tr[data-id="{victim}"]')
    expect(row).to_be_visible(timeout=15_000)
    page.fill("#search-id", victim)
    page.click("#search-btn")
    expect(page.locator("#timer-detail")).to_be_visible()
    expect(page.locator("#detail-fields")).to_contain_text("invoice-17")
    # Its payload only when asked for.
    expect(page.locator("#detail-fields")).to_contain_text("6 bytes (not shown)")
    expect(page.locator("#detail-fields")).not_to_contain_text("remind (")
    page.click("#payload-btn")
    expect(page.locator("#detail-fields")).to_contain_text("remind (6 bytes, utf-8)")
    expect(page.locator("#payload-btn")).to_be_hidden()

    # "Keep it" in the confirmation sends nothing.
    page.click("#cancel-btn")
    expect(page.locator("#confirm-dialog")).to_be_visible()
    expect(page.locator("#confirm-id")).to_have_text(victim)
    page.click("#confirm-no")
    expect(page.locator("#confirm-dialog")).to_be_hidden()
    expect(page.locator("#message")).to_be_hidden()

    # Firings and the dead letter show up; then the picture for the README.
    expect(page.locator("#firings tbody")).to_contain_text(soon[0], timeout=15_000)
    expect(page.locator("#dead-letters tbody")).to_contain_text("callback-topic-not-allowed")
    expect(page.locator("#partitions tbody tr")).to_have_count(4)
    expect(page.locator("#partitions tbody tr.bad")).to_have_count(0)
    shot = tmp_path / "admin-page.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("ADMIN_SCREENSHOT_TO"):
        shutil.copyfile(shot, os.environ["ADMIN_SCREENSHOT_TO"])

    page.click("#cancel-btn")
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.click("#confirm-yes")
    expect(page.locator("#message")).to_contain_text(f"Cancel sent for {victim}")
    expect(row).to_have_count(0, timeout=10_000)  # the list no longer shows it
    page.screenshot(path=str(tmp_path / "admin-page-after-cancel.png"), full_page=True)
    assert handle.due_ms > time.time() * 1000, "the cancel came after the due time: the test proves nothing"

    # It never fires: read past its due time; the timers around it did fire.
    wait_for(lambda: time.time() * 1000 > handle.due_ms + 2500, timeout_s=CANCEL_AFTER_S + 5, what="past due")
    reader.poll(1.0)
    fired = {c.timer_id for c in reader.records}
    assert victim not in fired
    assert set(soon) <= fired
    kinds = [e.kind for e in admin_stack.events() if e.id == victim]
    assert kinds == [TimerEvent.Kind.SCHEDULED, TimerEvent.Kind.CANCELLED]

    # No oscillator, no clock: every partition and the oscillator turn red.
    oscillator = admin_stack.oscillators[0]
    oscillator.stop()
    try:
        expect(page.locator("#partitions tbody tr.bad")).to_have_count(4, timeout=STALL_AFTER_S * 1000 + 5000)
        expect(page.locator("#oscillators tbody tr.bad")).to_have_count(1)
        page.screenshot(path=str(tmp_path / "admin-page-stalled.png"), full_page=True)
    finally:
        oscillator.start().wait_for_output(OSCILLATOR_READY, timeout_s=30)
    expect(page.locator("#partitions tbody tr.bad")).to_have_count(0, timeout=10_000)
    assert errors == []
