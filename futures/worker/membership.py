"""A restarted worker removes its dead incarnation from the consumer group at once.

With dynamic membership (no ``group.instance.id``: always on the embedded
broker, on a cluster when ``TIMERS_INSTANCE_ID`` is unset) a SIGKILLed worker
leaves its member in the group until the session timeout expires. A worker
restarted on the same data dir meanwhile joins as a second member; the group
forms, then breaks again when the old member expires, and forms once more —
two joins plus the session timeout before its partitions fire again.

So the worker writes its member id to ``TIMERS_DATA_DIR`` (:data:`MEMBER_FILE`)
each time it joins, and on start, before it joins, sends a LeaveGroup for the id
found there. Only the incarnation that owned the data dir wrote it; two live
workers never share a data dir (each owns its RocksDB files), so the member
removed is a dead one. Were it alive after all, it would be told at its next
heartbeat that it is unknown and rejoin under a new id: an ordinary rebalance,
no timer lost or fired early. A member id that the group no longer knows
(expired, or another group's) is answered with an error and ignored.

With static membership the broker already hands the rejoining instance its old
member, so nothing is sent (a LeaveGroup would force the rebalance static
membership avoids).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.group import LeaveGroupRequest

from futures.worker import faust_adapter

log = logging.getLogger(__name__)

#: The last member id of the worker that owns the data dir.
MEMBER_FILE = "consumer-member.json"
#: How long the LeaveGroup may take before the worker joins anyway (seconds).
LEAVE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Membership:
    group_id: str
    member_id: str


def read_member(data_dir: Path) -> Membership | None:
    """The membership recorded in ``data_dir``, or None (no file, or unreadable)."""
    path = data_dir / MEMBER_FILE
    try:
        body = json.loads(path.read_text())
        group_id, member_id = body["group_id"], body["member_id"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s: %r", path, exc)
        return None
    if not isinstance(group_id, str) or not isinstance(member_id, str) or not member_id:
        log.warning("ignoring %s: no group and member id in it", path)
        return None
    return Membership(group_id, member_id)


def write_member(data_dir: Path, membership: Membership) -> None:
    """Record ``membership`` in ``data_dir`` (atomically: a crash leaves the old or the new one)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / MEMBER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"group_id": membership.group_id, "member_id": membership.member_id}))
    os.replace(tmp, path)


async def leave_previous(consumer: Any, data_dir: Path) -> bool:
    """Send a LeaveGroup for the member recorded in ``data_dir`` through ``consumer``.

    ``consumer`` is a started aiokafka consumer of the group, not yet subscribed.
    True if the broker removed the member. Errors are logged, never raised: at
    worst the old member expires after the session timeout, as without this.
    """
    coordinator = faust_adapter.group_coordinator(consumer)
    previous = read_member(data_dir)
    if previous is None or coordinator is None or previous.group_id != coordinator.group_id:
        return False
    if previous.member_id == coordinator.member_id:
        return False
    request = LeaveGroupRequest(previous.group_id, previous.member_id)
    try:
        async with asyncio.timeout(LEAVE_TIMEOUT_S):
            await coordinator.ensure_coordinator_known()
            response = await faust_adapter.send_to_coordinator(consumer, coordinator, request)
    except (KafkaError, OSError, TimeoutError) as exc:
        log.warning("could not remove the previous member %s of group %s: %r",
                    previous.member_id, previous.group_id, exc)  # fmt: skip
        return False
    error = for_code(response.error_code)
    if response.error_code:
        log.info("previous member %s of group %s not removed: %s (already gone)",
                 previous.member_id, previous.group_id, error.__name__)  # fmt: skip
        return False
    log.info("removed the previous member %s of group %s", previous.member_id, previous.group_id)
    return True
