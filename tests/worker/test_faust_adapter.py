"""The contract with Faust, aiokafka and mode: what the worker relies on is there in the pinned versions.

The worker uses some of these libraries' private parts, all of them through
:mod:`futures.worker.faust_adapter`. These tests check, against the installed
versions, that each still exists in the shape the adapter uses, that the methods
it copies are unchanged, and that no private part is reached anywhere else; a
failure names what changed and what in the adapter uses it.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import importlib
import inspect
import pkgutil
import re
import textwrap
import time
from importlib import metadata
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.client import AIOKafkaClient
from aiokafka.consumer import fetcher
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder, _DefaultRecordBatchPy
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from faust.exceptions import ConsumerNotStarted
from faust.sensors.monitor import Monitor
from faust.stores.base import SerializedStore
from faust.types import TP

import futures.worker
from futures.worker import faust_adapter, fetch
from futures.worker.app import create_app
from futures.worker.config import WorkerConfig
from futures.worker.faust_adapter import MIRRORED, RELIES_ON, Reliance
from tests.worker.simulated_log import SimulatedLog

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = {"faust-streaming": "faust", "aiokafka": "aiokafka", "mode-streaming": "mode"}
ADAPTER = "futures/worker/faust_adapter.py"


def _where(reliance: Reliance) -> str:
    return f"{reliance.owner}.{reliance.name} (used by {reliance.used_by} in {ADAPTER})"


def _resolve(dotted: str) -> Any:
    """A module, or a class inside one, by its dotted name."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def shape(member: Any) -> str:
    """A callable's parameters as the adapter writes them: no annotations, ``=...`` for a default."""
    signature = inspect.signature(member)
    params = [
        p.replace(annotation=p.empty, default=p.empty if p.default is p.empty else Ellipsis)
        for p in signature.parameters.values()
    ]
    text = str(signature.replace(parameters=params, return_annotation=signature.empty)).replace(
        "=Ellipsis", "=..."
    )
    return f"async {text}" if inspect.iscoroutinefunction(member) else text


# -- the versions ---------------------------------------------------------------------------------


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==([^\s;#]+).*", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def test_the_installed_libraries_are_the_pinned_versions() -> None:
    pins = _pins()
    for distribution in LIBRARIES:
        assert distribution in pins, f"constraints.txt pins no version of {distribution}"
        installed = metadata.version(distribution)
        assert installed == pins[distribution], (
            f"{distribution} {installed} is installed but constraints.txt pins {pins[distribution]}: "
            f"the contract in {ADAPTER} is checked against the pinned versions; "
            f"install them with pip install -c constraints.txt {distribution}=={pins[distribution]}"
        )


# -- each name relied on, in the shape used -------------------------------------------------------


@pytest.mark.parametrize(
    "reliance", [r for r in RELIES_ON if r.shape != "attribute"], ids=lambda r: f"{r.owner}.{r.name}"
)
def test_each_method_class_and_property_relied_on_has_the_shape_used(reliance: Reliance) -> None:
    owner = _resolve(reliance.owner)
    assert hasattr(owner, reliance.name), f"{_where(reliance)} is gone"
    static = inspect.getattr_static(owner, reliance.name)
    if reliance.shape == "property":
        assert isinstance(static, property), f"{_where(reliance)} is no longer a property: {static!r}"
    elif reliance.shape == "class":
        assert inspect.isclass(static), f"{_where(reliance)} is no longer a class: {static!r}"
    elif reliance.shape == "module attribute":
        assert isinstance(owner, ModuleType), f"{reliance.owner} is no longer a module"
    else:
        member = getattr(owner, reliance.name)
        assert callable(member), f"{_where(reliance)} is no longer callable: {static!r}"
        found = shape(member)
        assert found == reliance.shape, (
            f"{_where(reliance)} changed: the adapter uses {reliance.shape}, it is now {found}"
        )


def _faust_consumer() -> Any:
    """Faust's aiokafka consumer of an app that never connects (nothing is started)."""
    app = faust.App("contract", broker="kafka://127.0.0.1:1", store="memory://")
    return app.consumer


async def _instances() -> dict[str, Any]:
    """An instance of each owner of an attribute relied on, built without a broker."""
    consumer = _faust_consumer()
    running = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    running.assign([TopicPartition("t", 0)])
    client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
    coordinator = GroupCoordinator(client, SubscriptionState(), group_id="contract")
    try:
        subscription = running._subscription.subscription
        return {
            "faust.transport.drivers.aiokafka.Consumer": consumer,
            "faust.transport.drivers.aiokafka.AIOKafkaConsumerThread": consumer._thread,
            "faust.sensors.monitor.Monitor": Monitor(),
            "aiokafka.consumer.consumer.AIOKafkaConsumer": running,
            "aiokafka.consumer.subscription_state.TopicPartitionState": subscription.assignment.state_value(
                TopicPartition("t", 0)
            ),
            "aiokafka.consumer.group_coordinator.GroupCoordinator": coordinator,
            "aiokafka.record.default_records._DefaultRecordBatchPy": _DefaultRecordBatchPy(_batch(b"k")),
            "aiokafka.consumer.fetcher.PartitionRecords": fetcher.PartitionRecords(
                TopicPartition("t", 0), MemoryRecords(_batch(b"k")), [], 0, None, None, True, 0
            ),
        }
    finally:
        await coordinator.close()
        await client.close()
        await running.stop()


def test_each_attribute_relied_on_is_set_on_instances() -> None:
    instances = asyncio.run(_instances())
    for reliance in RELIES_ON:
        if reliance.shape != "attribute":
            continue
        assert reliance.owner in instances, f"no instance of {reliance.owner} to check {_where(reliance)} on"
        instance = instances[reliance.owner]
        assert isinstance(instance, _resolve(reliance.owner)), f"{instance!r} is not a {reliance.owner}"
        assert hasattr(instance, reliance.name), f"{_where(reliance)} is no longer set on its instances"


def test_the_methods_the_worker_copies_are_unchanged() -> None:
    for mirrored in MIRRORED:
        source = textwrap.dedent(inspect.getsource(getattr(_resolve(mirrored.owner), mirrored.name)))
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        assert digest == mirrored.source_sha256, (
            f"{mirrored.owner}.{mirrored.name} changed (source sha256 {digest}, "
            f"was {mirrored.source_sha256}): {mirrored.copied_by} copies what it does; "
            f"bring the copy in line, then update MIRRORED in {ADAPTER}"
        )


def test_the_store_base_implements_every_abstract_hook_of_fausts_store() -> None:
    hooks = {n for n in SerializedStore.__abstractmethods__ if n.startswith("_")}
    named = {n for n in vars(faust_adapter.StoreBase) if n.startswith("_") and not n.startswith("__")}
    assert hooks <= named, (
        f"SerializedStore has new abstract hooks: {sorted(hooks - named)}; add them to StoreBase"
    )


# -- what the adapter's functions do, on real objects ---------------------------------------------


def test_applied_offsets_are_booked_exactly_as_fausts_own_ack_books_them() -> None:
    consumer = _faust_consumer()
    consumer.app.topics.acks_enabled_for = lambda topic: True  # as for a topic an agent consumes
    by_ack, by_adapter = TP("t", 0), TP("t", 1)
    # Two batches as fetched: 2 is below the committed offset; 4 is fetched again.
    batches = [[2, 3, 4], [4, 5]]
    for tp in (by_ack, by_adapter):
        consumer._committed_offset[tp] = 3
    for offset in (offset for batch in batches for offset in batch):
        consumer.ack(faust_adapter.to_message(consumer, by_ack, _record(by_ack, offset)))
    acked_by_faust = consumer._n_acked
    for batch in batches:
        faust_adapter.ack_offsets(consumer, by_adapter, batch)
    assert consumer._acked[by_adapter] == consumer._acked[by_ack] == [3, 4, 5]
    assert consumer._acked_index[by_adapter] == consumer._acked_index[by_ack]
    assert consumer._n_acked - acked_by_faust == acked_by_faust
    # What the next commit commits:
    assert consumer._new_offset(by_adapter) == consumer._new_offset(by_ack) == 6
    assert consumer._read_offset[by_adapter] == 5


def _record(tp: TP, offset: int) -> SimpleNamespace:
    return SimpleNamespace(
        topic=tp.topic, partition=tp.partition, offset=offset, timestamp=1_000, timestamp_type=0,
        headers=[], key=None, value=b"v", checksum=None, serialized_key_size=0, serialized_value_size=1,
    )  # fmt: skip


def test_the_fetch_position_is_aiokafkas_high_watermark_and_next_offset() -> None:
    async def check() -> None:
        consumer = _faust_consumer()
        tp = TP("t", 0)
        assert faust_adapter.fetch_position(consumer, tp) == (None, None, None)  # not started
        running = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        consumer._thread._consumer = running
        try:
            assert faust_adapter.fetch_position(consumer, tp) == (None, None, None)  # not assigned
            running.assign([TopicPartition("t", 0)])
            assert faust_adapter.fetch_position(consumer, tp) == (None, None, None)  # nothing fetched
            assignment = running._subscription.subscription.assignment
            state = assignment.state_value(TopicPartition("t", 0))
            state.seek(5)

            async def respond(assignment: Any, node_id: int, request: Any) -> None:
                state.highwater, state.timestamp = 9, time.time_ns() // 1_000_000  # as aiokafka does

            running._fetcher = SimpleNamespace(_proc_fetch_request=respond)
            faust_adapter.stamp_fetch_requests(running, lambda: None)
            before_ms = time.time_ns() // 1_000_000
            await running._fetcher._proc_fetch_request(
                assignment, 0, SimpleNamespace(topics=[("t", [(0, 5, 1)])])
            )
            highwater, position, fetched_ms = faust_adapter.fetch_position(consumer, tp)
            assert (highwater, position) == (9, 5)
            assert fetched_ms is not None and before_ms <= fetched_ms <= state.timestamp
        finally:
            running._fetcher = None
            await running.stop()

    asyncio.run(check())
    source = inspect.getsource(fetcher.Fetcher)
    assert "self._proc_fetch_request(assignment, node_id, request)" in source, (
        "aiokafka's Fetcher no longer runs each fetch request through self._proc_fetch_request: "
        f"stamp_fetch_requests in {ADAPTER} (the join's frontier) relies on it"
    )
    assert "for partition, offset, _ in partitions" in source, (
        "aiokafka's fetch requests no longer list (partition, offset, max bytes) per topic: "
        f"stamp_fetch_requests in {ADAPTER} (the join's frontier) relies on it"
    )
    assert "tp_state.timestamp = now_ms" in source, (
        "aiokafka's Fetcher no longer stamps each fetch response in the partition's state: "
        f"fetch_position in {ADAPTER} (the join's frontier) relies on it"
    )
    assert "tp_state.highwater = highwater" in source, (
        "aiokafka's Fetcher no longer records each fetch response's high watermark in the partition's "
        f"state: fetch_position in {ADAPTER} (the join's frontier) relies on it"
    )


def test_the_fetch_wait_set_on_a_consumer_reaches_its_fetcher() -> None:
    async def check() -> None:
        running = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        faust_adapter.set_fetch_max_wait(running, 10)
        await running.stop()
        assert running._fetch_max_wait_ms == 10

    asyncio.run(check())
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start), (
        "AIOKafkaConsumer.start no longer hands _fetch_max_wait_ms to its Fetcher: "
        f"set_fetch_max_wait in {ADAPTER}"
    )


@pytest.mark.parametrize(("profile", "wait_ms"), [("embedded", 10), ("cluster", 100)])
def test_the_embedded_profiles_consumer_holds_a_fetch_10_ms_and_a_clusters_100(
    tmp_path: Path, profile: str, wait_ms: int
) -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path)}
    config = WorkerConfig.from_env({**env, "TIMERS_BROKER_PROFILE": profile})
    thread = create_app(config, partitions=4).app.consumer._thread

    async def created() -> int:
        # What the thread's on_start does first (Faust builds the consumer through the hook).
        consumer = thread._create_consumer(loop=asyncio.get_running_loop())
        await consumer.stop()
        return int(consumer._fetch_max_wait_ms)

    assert asyncio.run(created()) == wait_ms


@pytest.mark.parametrize("profile", ["embedded", "cluster"])
def test_the_workers_consumer_reads_only_committed_transactions(tmp_path: Path, profile: str) -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIMERS_DATA_DIR": str(tmp_path)}
    config = WorkerConfig.from_env({**env, "TIMERS_BROKER_PROFILE": profile})
    thread = create_app(config, partitions=4).app.consumer._thread

    async def created() -> str:
        consumer = thread._create_consumer(loop=asyncio.get_running_loop())
        await consumer.stop()
        return str(consumer._isolation_level)

    assert asyncio.run(created()) == "read_committed"
    assert "isolation_level=self._isolation_level" in inspect.getsource(AIOKafkaConsumer.start), (
        f"AIOKafkaConsumer.start no longer hands _isolation_level to its Fetcher: read_committed in {ADAPTER}"
    )


class _Reporting(faust_adapter.PartitionRecordsBase):
    def __init__(self, *args: Any) -> None:
        self.passed: list[tuple[int, int]] = []
        super().__init__(*args)

    def on_passed(self, tp: Any, start: int, end: int) -> None:
        self.passed.append((start, end))


def _transactional_log() -> SimulatedLog:
    log = SimulatedLog()
    log.write([b"plain-0", b"plain-1"])
    log.write_in_transaction(1, [b"committed-0"])
    log.write_in_transaction(2, [b"aborted-0", b"aborted-1"])
    log.write([b"plain-2"])
    log.write_in_transaction(2, [b"aborted-2"])
    log.end_transaction(2, commit=False)
    log.end_transaction(1, commit=True)
    log.write_in_transaction(1, [b"committed-1"])
    log.end_transaction(1, commit=True)  # the log ends on a marker
    return log


@pytest.mark.parametrize("lenient", [False, True], ids=["aiokafka's records", "the worker's lenient records"])
@pytest.mark.parametrize("start", [0, 3, 4, 9])
def test_a_partitions_reader_reports_every_offset_it_reads_past_and_hands_out_no_aborted_record(
    lenient: bool, start: int
) -> None:
    log = _transactional_log()
    data, aborted = log.fetch(start, len(log.batches))
    records = fetch.LenientMemoryRecords(data) if lenient else MemoryRecords(data)
    reader = _Reporting(
        TopicPartition("t", 0), records, aborted, start, None, None, True, fetcher.READ_COMMITTED
    )
    handed = [(r.offset, r.value) for r in reader]

    assert [v for _, v in handed] == [
        v
        for v in [b"plain-0", b"plain-1", b"committed-0", b"plain-2", b"committed-1"]
        if v in dict(handed).values()
    ]
    assert all(not v.startswith(b"aborted") for _, v in handed)
    assert reader.next_fetch_offset == log.end
    # Every offset from the fetch offset to the end is either handed out or reported, once.
    reported = [o for s, e in reader.passed for o in range(s, e)]
    assert sorted(reported + [o for o, _ in handed]) == list(range(start, log.end))


def test_the_fetcher_builds_partition_readers_by_the_name_replaced() -> None:
    tree = ast.parse(inspect.getsource(fetcher))
    built = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "PartitionRecords"
    ]
    assert built, (
        f"aiokafka's fetcher no longer calls PartitionRecords by name: use_partition_records in {ADAPTER}"
    )
    init = inspect.getsource(fetcher.PartitionRecords.__init__)
    assert "self._records_iterator = self._unpack_records()" in init, (
        f"PartitionRecords no longer reads through _unpack_records: PartitionRecordsBase in {ADAPTER}"
    )
    assert "self.next_fetch_offset = fetch_offset" in init, (
        f"PartitionRecords no longer starts at the fetch offset: PartitionRecordsBase in {ADAPTER}"
    )


def test_an_unstarted_consumer_thread_says_so() -> None:
    with pytest.raises(ConsumerNotStarted):
        faust_adapter.started_consumer(_faust_consumer()._thread)


def test_the_group_coordinator_names_the_member_and_group() -> None:
    async def check() -> None:
        running = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", group_id="contract")
        assert faust_adapter.group_coordinator(running) is None  # created by start()
        await running.stop()
        client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
        coordinator = GroupCoordinator(client, SubscriptionState(), group_id="contract")
        try:
            named = (coordinator.group_id, coordinator.member_id, coordinator.coordinator_id)
            assert named == ("contract", "", None)
        finally:
            await coordinator.close()
            await client.close()

    asyncio.run(check())
    assert "self._coordinator = GroupCoordinator(" in inspect.getsource(AIOKafkaConsumer.start)


def _batch(header_key: bytes) -> bytes:
    """One uncompressed record batch, its record's header key exactly ``header_key``."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 16,
    )  # fmt: skip
    builder.append(0, timestamp=1_000, key=b"key", value=b"value", headers=[("HEADERKEY", b"h")])
    return bytes(builder.build()).replace(b"HEADERKEY", header_key.ljust(9, b"_"))


def test_the_python_batch_reader_decodes_header_keys_from_slices_of_its_buffer() -> None:
    raw = _batch(b"\xffkey")
    with pytest.raises(CorruptRecordException, match="UnicodeDecodeError"):
        list(_DefaultRecordBatchPy(raw))  # what would stop the consumer
    [record] = list(faust_adapter.LenientPythonBatch(raw))
    assert (record.key, record.value, record.headers) == (b"key", b"value", [("\udcffkey_____", b"h")])


def test_the_fetcher_builds_records_by_the_name_replaced_and_uses_only_what_the_replacement_has() -> None:
    tree = ast.parse(inspect.getsource(fetcher))
    built = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "MemoryRecords"
    ]  # fmt: skip
    assert built, f"aiokafka's fetcher no longer calls MemoryRecords by name: use_fetch_records in {ADAPTER}"
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "records"
    }
    offered = {"has_next", "next_batch", "size_in_bytes"}  # futures.worker.fetch.LenientMemoryRecords
    assert used <= offered, f"aiokafka's fetcher now uses {sorted(used - offered)} of its MemoryRecords"


# -- nothing private reached elsewhere, nothing shadowed -------------------------------------------


def _is_library(cls: type) -> bool:
    return cls.__module__.split(".")[0] in LIBRARIES.values()


def _own_names(cls: type) -> set[str]:
    """The names a class's source defines: methods, class attributes, and attributes set on ``self``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    [body] = tree.body
    assert isinstance(body, ast.ClassDef)
    names = set()
    for stmt in body.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
    for node in ast.walk(body):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _library_names(cls: type) -> set[str]:
    names: set[str] = set()
    for base in cls.__mro__:
        if _is_library(base):
            names |= set(vars(base)) | _own_names(base)
    return names


def _worker_modules() -> list[ModuleType]:
    return [
        importlib.import_module(f"futures.worker.{m.name}")
        for m in pkgutil.iter_modules(futures.worker.__path__)
    ]


def _library_subclasses() -> dict[str, type]:
    found = {}
    for module in _worker_modules():
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and any(map(_is_library, cls.__mro__))
            ):
                found[f"{module.__name__}.{cls.__qualname__}"] = cls
    return found


#: What each of our subclasses of a library class overrides on purpose; any other name it
#: defines must be new to the library (an upgrade that adds it would be shadowed).
OVERRIDES = {
    "futures.worker.faust_adapter.ConsumerBase": {"_new_consumer_thread", "_getmany"},
    "futures.worker.faust_adapter.ConsumerThreadBase": {"_create_worker_consumer", "_fetch_records"},
    "futures.worker.faust_adapter.StoreBase": {r.name for r in RELIES_ON if r.used_by == "StoreBase"},
    "futures.worker.faust_adapter.LenientPythonBatch": {"_buffer", "_maybe_uncompress"},
    "futures.worker.faust_adapter.PartitionRecordsBase": {"_unpack_records", "_tp"},
    "futures.worker.fetch.ReportingPartitionRecords": set(),
    "futures.worker.app.PromptTableManager": {"on_start", "on_partitions_revoked"},
    "futures.worker.web.MetricsServer": {"on_start", "on_stop"},
    "futures.worker.store.TimerStore": set(
        "on_start stop persisted_offset set_persisted_offset apply_changelog_batch on_rebalance "
        "on_recovery_completed backup_partition restore_backup reset_state".split()
    ),
    "futures.worker.transport.TimerConsumerThread": {"on_start", "on_partitions_assigned"},
    "futures.worker.transport.TimerConsumer": {"getmany", "seek_to_committed"},
    "futures.worker.transport.ShortFetchConsumerThread": set(),
    "futures.worker.transport.ShortFetchConsumer": set(),
    "futures.worker.transport.TimerTransport": {"Consumer"},
    "futures.worker.transport.EmbeddedBrokerTransport": {"Consumer"},
}


def test_subclasses_override_only_what_they_mean_to_with_the_librarys_signature() -> None:
    subclasses = _library_subclasses()
    assert set(subclasses) == set(OVERRIDES), (
        f"subclasses of library classes: declare in OVERRIDES what {sorted(set(subclasses) - set(OVERRIDES))}"
        f" override; {sorted(set(OVERRIDES) - set(subclasses))} are gone"
    )
    for qualname, cls in subclasses.items():
        library = _library_names(cls)
        overridden = _own_names(cls) & library
        assert overridden == OVERRIDES[qualname], (
            f"{qualname} now shadows {sorted(overridden - OVERRIDES[qualname])} of its library base; "
            f"overrides {sorted(OVERRIDES[qualname] - overridden)} are of names the library no longer has"
        )
        base = next(b for b in cls.__mro__[1:] if _is_library(b))
        for name in overridden:
            ours, theirs = inspect.getattr_static(cls, name, None), inspect.getattr_static(base, name, None)
            if inspect.isfunction(ours) and inspect.isfunction(theirs):
                assert shape(ours) == shape(theirs), (
                    f"{qualname}.{name} overrides {base.__module__}.{base.__qualname__}.{name}, "
                    f"which now takes {shape(theirs)} (ours: {shape(ours)})"
                )


def test_no_private_part_of_a_library_is_reached_outside_the_adapter() -> None:
    found = []
    for module in _worker_modules():
        if module is faust_adapter:
            continue
        path = Path(inspect.getfile(module))
        if path.suffix != ".py":
            # Compiled (Cython), which ``ast`` cannot read: such a module imports no library at all.
            source = path.with_name(f"{module.__name__.rpartition('.')[2]}.pyx")
            imported = re.findall(r"^\s*(?:from|c?import)\s+([\w.]+)", source.read_text(), re.MULTILINE)
            found += [
                f"{source.name}: imports {name}"
                for name in imported
                if name.split(".")[0] in LIBRARIES.values()
            ]
            continue
        tree = ast.parse(path.read_text())
        imports_library = any(
            (
                isinstance(node, ast.Import)
                and any(a.name.split(".")[0] in LIBRARIES.values() for a in node.names)
            )
            or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES.values())
            for node in ast.walk(tree)
        )
        if not imports_library:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES.values():
                found += [
                    f"{path.name}:{node.lineno}: imports {a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not on_self:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    # Within our subclasses of library classes, self._x must be one of ours.
    for qualname, cls in _library_subclasses().items():
        if cls.__module__ == faust_adapter.__name__:
            continue
        ours = set().union(*(_own_names(k) for k in cls.__mro__ if k.__module__.startswith("futures.")))
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in ours
            ):
                found.append(f"{qualname}: self.{node.attr}")
    assert not found, f"private parts of Faust/aiokafka/mode reached outside {ADAPTER}: {found}"


def test_every_private_name_the_adapter_uses_is_listed_and_every_listed_one_is_used() -> None:
    tree = ast.parse(inspect.getsource(faust_adapter))
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.ClassDef):
            used |= {s.name for s in node.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}
            used |= {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    private = {n for n in used if n.startswith("_") and not n.startswith("__")}
    listed = {r.name for r in RELIES_ON}
    assert private <= listed, (
        f"{ADAPTER} uses private names RELIES_ON does not list: {sorted(private - listed)}"
    )
    unused = {n for n in listed if n.startswith("_")} - used
    assert not unused, f"RELIES_ON lists private names {ADAPTER} no longer uses: {sorted(unused)}"
