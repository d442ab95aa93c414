"""The Faust app object: broker connection, the timer table and its settings.

Built by :func:`create_app` from a :class:`WorkerConfig`; nothing is created at
import time, so tests and tools can build apps with their own settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import faust
from faust.tables import TableManager
from faust.types import TP, TableT

from futures.worker import faust_adapter
from futures.worker.changelog_topic import COMPACTION_LAG_MS
from futures.worker.config import TABLE_NAME, WorkerConfig
from futures.worker.store import TimerStore
from ktimers.config import KafkaConfig


@dataclass
class TimersApp:
    app: faust.App
    table: TableT

    @property
    def store(self) -> TimerStore:
        store = self.table.data
        assert isinstance(store, TimerStore)  # noqa: S101 - set by create_app
        return store


class PromptTableManager(TableManager):
    """Faust's table manager without its one-second sleep before the first subscription.

    Faust sleeps so that tables declared while the worker starts are registered
    before it subscribes; ours is declared in :func:`create_app`, before. The
    second went straight into every start's time to its group join, and so into
    a restarted worker's silence.
    """

    async def on_start(self) -> None:
        await faust_adapter.start_table_manager(self)

    def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """The earliest Faust says which partitions go: first thing of its revocation, before
        the group rejoins (aiokafka's eager protocol), so before a new owner can fire their timers."""
        for table in self.values():
            if isinstance(table.data, TimerStore):
                table.data.revoke(revoked)
        super().on_partitions_revoked(revoked)


def _broker_url(kafka: KafkaConfig, scheme: str = "kafka") -> str:
    return ";".join(f"{scheme}://{server.strip()}" for server in kafka.bootstrap_servers.split(","))


def _credentials(kafka: KafkaConfig) -> faust.types.auth.CredentialsT | None:
    context = kafka.ssl_context()
    if kafka.security_protocol.startswith("SASL"):
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password else ""
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=password,
            mechanism=kafka.sasl_mechanism,
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def create_app(config: WorkerConfig, partitions: int) -> TimersApp:
    """A Faust app whose timer table has ``partitions`` partitions (= `timer-request`'s)."""
    kafka = config.common.kafka
    profile = kafka.settings
    session_s, heartbeat_s, rebalance_s = config.group_timeouts
    app = faust.App(
        config.app_id,
        broker=_broker_url(kafka),
        # See futures/worker/transport.py: resume from the table's progress; a short
        # fetch wait on the embedded broker only.
        broker_consumer=_broker_url(kafka, "tansu" if profile.short_fetch_wait else "timers"),
        broker_credentials=_credentials(kafka),
        # Faust defaults datadir to "<id>-data" in the working directory; keep it all in one place.
        datadir=str(config.data_dir),
        tabledir=str(config.data_dir),
        topic_partitions=partitions,
        topic_replication_factor=profile.replication_factor,
        broker_session_timeout=session_s,
        broker_heartbeat_interval=heartbeat_s,
        broker_rebalance_timeout=rebalance_s,
        # Static membership: a worker back within the session timeout takes its own
        # partitions back without a rebalance. Not on the embedded broker (see ProfileSettings).
        consumer_group_instance_id=config.instance_id if profile.static_membership else None,
        consumer_auto_offset_reset="earliest",
        web_host=config.web_host,
        web_port=config.web_port,
        web_bind=config.web_host,
        # What the group's assignment tells the other workers (the admin API's map of who
        # holds which partition): a bind address such as 0.0.0.0 would name no worker.
        canonical_url=config.canonical_url,
        web_in_thread=False,
        # The engine writes the changelog itself, through confluent-kafka; Faust's
        # producer only sends its own bookkeeping.
        producer_acks=-1,
        # One copy per partition is enough: the changelog is the replica.
        table_standby_replicas=0,
        # Topics are created by `timers topics create`; Faust only adds its changelog.
        topic_allow_declare=True,
        TableManager=PromptTableManager,
    )
    table = app.Table(
        TABLE_NAME,
        partitions=partitions,
        # bytes types make Faust use the "raw" codec for the changelog too.
        key_type=bytes,
        value_type=bytes,
        store="timers://local",  # a bare "timers://" is falsy to yarl and Faust would fall back to memory
        # Replaying the changelog is bulk RocksDB writes; big batches make it fast.
        recovery_buffer_size=10_000,
        # Keeps a record from compaction until a key a revoked owner wrote late is written again.
        extra_topic_configs={"min.compaction.lag.ms": str(COMPACTION_LAG_MS)},
        help="Pending timers by due time (see futures/worker/table.py)",
    )
    timers = TimersApp(app=app, table=table)
    timers.store.request_topic = config.common.topics.request
    return timers
