"""``timers status``: the service at a glance, from every worker's ``/api/stats`` and the
consumer group's offsets on the request topic.

Which worker holds which partition, each partition's pending timers and clock (its
watermark, and how far behind the worker's clock it is), the requests not yet taken in
(``request_lag``: the request topic's end offset less the group's committed offset), the
oscillators the workers hear, and dead letters by reason. Times are epoch seconds (``*_s``)
as the admin API gives them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from futures.console.admin import AdminApi, Json
from futures.console.decode import iso_ms
from futures.console.table import table
from ktimers.config import CommonConfig

#: Seconds the offset queries may take, each.
OFFSETS_TIMEOUT_S = 5.0

#: ``lag(partitions)`` → {partition: requests not yet taken in, or None when unknown}.
LagSource = Callable[[int], dict[int, int | None]]

_PARTITION_FIELDS = (
    "pending",
    "watermark_s",
    "clock_lag_s",
    "last_tick_age_s",
    "last_tick_source",
    "stalled",
    "stall_reason",
)
_WORKER_FIELDS = ("ready", "pending", "next_due_ms", "fired_last_minute", "lateness", "timer_reads")


def request_lag(common: CommonConfig, group: str, logger: Any) -> LagSource:
    """The lag of consumer group ``group`` on the request topic, per partition.

    A broker that under-reports a partition's end (the embedded one) makes it look smaller,
    never negative; a partition the group never committed has no lag to tell (None).
    """

    def lag(partitions: int) -> dict[int, int | None]:
        consumer = Consumer(
            {**common.kafka.librdkafka(), "group.id": group, "enable.auto.commit": False, "logger": logger}
        )
        try:
            wanted = [TopicPartition(common.topics.request, p) for p in range(partitions)]
            committed = consumer.committed(wanted, timeout=OFFSETS_TIMEOUT_S)
            found: dict[int, int | None] = {}
            for tp in committed:
                if tp.error is not None or tp.offset < 0:
                    found[tp.partition] = None
                    continue
                _, high = consumer.get_watermark_offsets(tp, timeout=OFFSETS_TIMEOUT_S)
                found[tp.partition] = max(high - tp.offset, 0)
            return found
        except KafkaException:
            return {}
        finally:
            consumer.close()

    return lag


def cluster_status(api: AdminApi, partitions: int, lag: LagSource) -> Json:
    """Every worker's stats merged: ``workers``, ``partitions`` (all of the request topic's,
    a worker of ``None`` for one nobody answered for), ``oscillators``, ``dead_letters``."""
    workers: list[Json] = []
    rows: dict[int, Json] = {}
    oscillators: dict[str, Json] = {}
    dead: dict[str, int] = {}
    for answer in api.each("/api/stats", _held):
        body = answer.body
        held = [
            p for p in _list(body, "partitions") if isinstance(p, dict) and type(p.get("partition")) is int
        ]
        workers.append(
            {
                "url": answer.url,
                **{k: body.get(k) for k in _WORKER_FIELDS},
                "partitions": [p["partition"] for p in held],
            }
        )
        for p in held:
            rows[p["partition"]] = {"worker": answer.url, **{k: p.get(k) for k in _PARTITION_FIELDS}}
        for seen in _list(body, "oscillators"):
            if isinstance(seen, dict) and isinstance(seen.get("source"), str):
                known = oscillators.get(seen["source"])
                if known is None or _age(seen) < _age(known):
                    oscillators[seen["source"]] = seen
        letters = body.get("dead_letters")
        for reason, counted in letters.items() if isinstance(letters, Mapping) else ():
            count = counted.get("count") if isinstance(counted, Mapping) else None
            if type(count) is int:
                dead[str(reason)] = dead.get(str(reason), 0) + count
    lags = lag(partitions)
    table = [
        {"partition": p, **rows.get(p, {"worker": None}), "request_lag": lags.get(p)}
        for p in range(partitions)
    ]
    return {
        "workers": workers,
        "partitions": table,
        "oscillators": sorted(oscillators.values(), key=lambda o: str(o["source"])),
        "dead_letters": dict(sorted(dead.items())),
        "unreachable": dict(sorted(api.unreachable.items())),
    }


def _held(body: Json) -> set[int]:
    return {
        p["partition"]
        for p in _list(body, "partitions")
        if isinstance(p, dict) and type(p.get("partition")) is int
    }


def _list(body: Json, name: str) -> list[Any]:
    found = body.get(name)
    return found if isinstance(found, list) else []


def _age(seen: Json) -> float:
    age = seen.get("age_s")
    return float(age) if isinstance(age, int | float) and not isinstance(age, bool) else float("inf")


def status_tables(status: Json) -> str:
    """:func:`cluster_status` as tables: workers, partitions, oscillators, dead letters."""
    workers = [
        [
            w["url"],
            w.get("ready"),
            ",".join(map(str, w["partitions"])),
            w.get("pending"),
            _time(w.get("next_due_ms"), 1),
            w.get("fired_last_minute"),
            w["lateness"].get("p99_s") if isinstance(w.get("lateness"), dict) else None,
        ]
        for w in status["workers"]
    ]
    columns = ["partition", "worker", "pending", "watermark_s", "clock_lag_s", "last_tick_age_s", "stalled"]
    partitions = [
        [_time(p.get(c), 1000) if c == "watermark_s" else p.get(c) for c in columns] + [p.get("request_lag")]
        for p in status["partitions"]
    ]
    blocks = [
        table(
            ["worker", "ready", "partitions", "pending", "next_due", "fired_last_minute", "lateness_p99_s"],
            workers,
        ),
        table([*columns[:3], "clock", *columns[4:], "request_lag"], partitions),
    ]
    if status["oscillators"]:
        rows = [
            [o.get(c) for c in ("source", "last_second", "age_s", "stale")] for o in status["oscillators"]
        ]
        blocks.append(table(["oscillator", "last_second", "age_s", "stale"], rows))
    if status["dead_letters"]:
        blocks.append(table(["dead_letter_reason", "count"], list(status["dead_letters"].items())))
    return "\n\n".join(blocks)


def _time(value: object, ms_per_unit: int) -> object:
    """Epoch seconds (``ms_per_unit`` 1000) or milliseconds (1) as a UTC time; other values as they are."""
    return iso_ms(value * ms_per_unit) if type(value) is int else value
