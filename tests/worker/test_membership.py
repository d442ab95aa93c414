"""A restarted worker removes the member its dead incarnation left in the group."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.group import LeaveGroupRequest

from futures.worker.membership import MEMBER_FILE, Membership, leave_previous, read_member, write_member


def test_the_member_written_is_read_back(tmp_path: Path) -> None:
    write_member(tmp_path, Membership("timers", "faust-1"))
    write_member(tmp_path, Membership("timers", "faust-2"))  # the next join replaces it
    assert read_member(tmp_path) == Membership("timers", "faust-2")
    assert [p.name for p in tmp_path.iterdir()] == [MEMBER_FILE]  # no temporary file left


def test_a_missing_or_damaged_file_is_no_member(tmp_path: Path) -> None:
    assert read_member(tmp_path) is None
    (tmp_path / MEMBER_FILE).write_text("{not json")
    assert read_member(tmp_path) is None
    (tmp_path / MEMBER_FILE).write_text('{"group_id": "timers", "member_id": ""}')
    assert read_member(tmp_path) is None


@dataclass
class Response:
    error_code: int


@dataclass
class FakeCoordinator:
    group_id: str
    member_id: str = ""
    coordinator_id: int = 7

    async def ensure_coordinator_known(self) -> None:
        return None


@dataclass
class FakeClient:
    error_code: int = 0
    fail: bool = False
    sent: list[tuple[int, Any]] = field(default_factory=list)

    async def send(self, node: int, request: Any) -> Response:
        if self.fail:
            raise KafkaConnectionError("broker gone")
        self.sent.append((node, request))
        return Response(self.error_code)


@dataclass
class FakeConsumer:
    _coordinator: FakeCoordinator
    _client: FakeClient


def test_a_restart_sends_leave_group_for_the_recorded_member(tmp_path: Path) -> None:
    write_member(tmp_path, Membership("timers", "faust-old"))
    consumer = FakeConsumer(FakeCoordinator("timers"), FakeClient())
    assert asyncio.run(leave_previous(consumer, tmp_path)) is True
    [(node, request)] = consumer._client.sent
    assert node == 7
    assert isinstance(request, LeaveGroupRequest)
    assert (request._group, request._member_id) == ("timers", "faust-old")


def test_nothing_is_sent_for_another_group_or_without_a_record(tmp_path: Path) -> None:
    consumer = FakeConsumer(FakeCoordinator("timers"), FakeClient())
    assert asyncio.run(leave_previous(consumer, tmp_path)) is False
    write_member(tmp_path, Membership("other-app", "faust-old"))
    assert asyncio.run(leave_previous(consumer, tmp_path)) is False
    assert consumer._client.sent == []


def test_a_member_already_gone_or_a_broker_error_does_not_stop_the_start(tmp_path: Path) -> None:
    write_member(tmp_path, Membership("timers", "faust-old"))
    unknown_member = 25
    gone = FakeConsumer(FakeCoordinator("timers"), FakeClient(error_code=unknown_member))
    assert asyncio.run(leave_previous(gone, tmp_path)) is False
    down = FakeConsumer(FakeCoordinator("timers"), FakeClient(fail=True))
    assert asyncio.run(leave_previous(down, tmp_path)) is False
