"""Worker configuration: one frozen object, built from the environment at start."""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

from futures.ingress.limits import DEFAULT_APP_ID, DEFAULT_DENIED_CALLBACK_TOPICS, ParseLimits
from futures.ingress.registry import SchemaCheck
from futures.worker.schemas import REGISTRY_ENV, SchemaRegistryConfig
from ktimers.config import (
    NO_DEFAULT,
    CommonConfig,
    Env,
    EnvVar,
    Secret,
    default_of,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_secret,
    profile_default,
)
from ktimers.errors import ConfigError

TABLE_NAME = "timers"

#: Bytes a record may add to a stored timer on its way out: the table key, the
#: ``kt-*`` callback headers and record framing. The worker's producer accepts
#: records up to ``max_payload_bytes`` plus this (``message.max.bytes``).
RECORD_ALLOWANCE_BYTES = 16 * 1024


@dataclass(frozen=True)
class FireBudget:
    """``TIMERS_FIRE_BUDGET_BYTES``: what the worker holds for firing, all partitions together.

    Shared out so that no part waits for another's bytes: a share for a firing — three pieces
    in flight and one being read, each a sixth of the share as stored timers and at most as
    much again once built into callbacks (:func:`piece_count`) — and the rest for what the
    mode builds ahead: the callbacks of the next second (second mode: half), or the open
    windows (precise mode: three quarters, a firing there fires only what a window left).
    """

    total: int
    precise: bool = False

    @classmethod
    def least_for(cls, max_timer_bytes: int, precise: bool) -> int:
        """The smallest budget that :meth:`holds` stored timers of ``max_timer_bytes`` (bytes)."""
        high = 1
        while not cls(high, precise).holds(max_timer_bytes):
            high *= 2
        low = high // 2  # does not hold (or is 0)
        while low + 1 < high:
            middle = (low + high) // 2
            low, high = (low, middle) if cls(middle, precise).holds(max_timer_bytes) else (middle, high)
        return high

    def holds(self, max_timer_bytes: int) -> bool:
        """A piece read up to :attr:`piece` and one stored timer of ``max_timer_bytes`` past it
        fit the firing's share: what a firing sends stays within it whatever the payloads."""
        return self.piece + max_timer_bytes <= self.firing

    @property
    def firing(self) -> int:
        """Bytes a firing holds, all its pieces together."""
        return self.total // 4 if self.precise else self.total // 2

    @property
    def piece(self) -> int:
        """Bytes of stored timers a firing reads for one piece."""
        return max(self.firing // 6, 1)

    @property
    def ahead(self) -> int:
        """Bytes of callbacks built ahead: the lookahead's, or all open precise windows'."""
        return max(self.total - self.firing, 1)


class LatePolicy(enum.Enum):
    """What to do with a request that arrives after its due time has passed.

    Late requests always fire on arrival while they are at most
    ``max_lateness_s`` late; beyond that, ``fire`` still fires them, ``drop``
    discards them (a ``rejected`` event records it) and ``dlq`` dead-letters them.
    """

    FIRE = "fire"
    DROP = "drop"
    DLQ = "dlq"


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the futures worker reads from ``TIMERS_*``: the defaults here are the only ones."""

    common: CommonConfig = field(default_factory=CommonConfig)
    app_id: str = DEFAULT_APP_ID
    data_dir: Path = Path("data")
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    #: Also serve ``/metrics`` alone on this port (same address), so that a NetworkPolicy can
    #: admit Prometheus to the metrics and nobody else to the admin API. None: the web port only.
    metrics_port: int | None = None
    #: How the other workers and the admin API's users reach this one's web port, e.g.
    #: ``http://timers-worker-0.timers-worker.ns.svc:6066``: the admin API names the worker
    #: holding a partition by it. None: ``http://<web_host>:<web_port>``, which only works
    #: when ``web_host`` is an address the others can reach (not 0.0.0.0).
    advertised_url: str | None = None
    late_policy: LatePolicy = LatePolicy.FIRE
    max_lateness_s: float = 3600.0
    #: A tick may run this far (ms) ahead of the worker's own clock; the
    #: watermark never passes ``now + clock_tolerance_ms``.
    clock_tolerance_ms: int = 500
    #: A tick waits for the requests of its partition written before it (a cancel, a new
    #: version) at most this long (seconds), then fires without them (futures/worker/join.py).
    join_max_wait_s: float = 60.0
    #: fnmatch patterns of allowed callback topics; empty allows any topic
    #: except the service's own, ``__*`` internals and ``denied_callback_topics``.
    allowed_callback_topics: tuple[str, ...] = ()
    #: fnmatch patterns of refused callback topics (see DEFAULT_DENIED_CALLBACK_TOPICS).
    denied_callback_topics: tuple[str, ...] = DEFAULT_DENIED_CALLBACK_TOPICS
    #: Largest timer accepted, as stored: its serialized ``StoredTimer`` plus table
    #: key (bytes). Larger requests are dead-lettered ``payload-too-large`` at ingest.
    max_payload_bytes: int = 1_000_000
    #: Reject timers due further ahead than this (seconds); 0 = no limit.
    max_due_ahead_s: float = 0.0
    #: Request records per engine step: a fetched batch is ingested in pieces of at
    #: most this many (and ``transport.CHUNK_BYTES`` of values), each made durable before the next.
    ingest_batch_size: int = 2000
    #: Timers dispatched per produce/flush round when a second is due.
    fire_chunk_size: int = 60_000
    #: What the worker holds for firing, all partitions together (bytes): callbacks built ahead,
    #: pieces in flight and precise windows (futures/worker/context.py, FireBudget). A callback
    #: held costs ``CALLBACK_OVERHEAD_BYTES`` besides its payload: 128 MiB holds a second of
    #: 100,000 timers with 100-byte payloads ahead of its tick (second mode) or in its window
    #: (precise mode; docs/PERFORMANCE.md#lateness).
    fire_budget_bytes: int = 128 * 1024 * 1024
    #: Precise mode: on tick s, also take the timers due by s + 1 and send each
    #: at its own millisecond (by this worker's clock), instead of all at the next tick.
    precise: bool = False
    #: Bearer token the admin API's mutating calls (cancel, reschedule) require;
    #: None disables them (the admin API and page are then read-only).
    admin_token: Secret | None = None
    #: Bearer token that reads timers (ids, callbacks, payloads on request) but cannot
    #: change them; the admin token reads too. None: only the admin token reads.
    admin_read_token: Secret | None = None
    #: Timer reads need no token: for a web port nobody else reaches (127.0.0.1).
    admin_open_reads: bool = False
    #: The admin page shows a partition red when its watermark is this many
    #: seconds behind the worker's clock.
    admin_stall_after_s: float = 5.0
    #: Static group membership (Kafka's ``group.instance.id``): a name that stays the same
    #: across restarts of this worker and that no other worker uses (the StatefulSet pod
    #: name). None: dynamic membership.
    instance_id: str | None = None
    #: Consumer group timeouts (seconds); None takes the broker profile's
    #: (see :class:`ktimers.config.ProfileSettings`).
    session_timeout_s: float | None = None
    heartbeat_s: float | None = None
    rebalance_timeout_s: float | None = None
    #: The request topic's own fnmatch patterns of callback topics; empty: ``allowed_callback_topics``.
    request_allowed_callback_topics: tuple[str, ...] = ()
    #: The Schema Registry that framed requests' schema ids are checked against; None trusts them.
    schema_registry: SchemaRegistryConfig | None = None

    @classmethod
    def from_env(cls, env: Env | None = None) -> WorkerConfig:
        env = os.environ if env is None else env
        policy = env_choice(env, "TIMERS_LATE_POLICY", LatePolicy, cls.late_policy)
        assert isinstance(policy, LatePolicy)  # noqa: S101 - narrows env_choice's return
        allowed = _patterns(env.get("TIMERS_ALLOWED_CALLBACK_TOPICS", ""))
        denied = env.get("TIMERS_DENIED_CALLBACK_TOPICS")
        config = cls(
            common=CommonConfig.from_env(env),
            app_id=env.get("TIMERS_APP_ID") or cls.app_id,
            # Absolute: Faust would nest a relative table dir under its data dir.
            data_dir=Path(env.get("TIMERS_DATA_DIR") or cls.data_dir).resolve(),
            web_host=env.get("TIMERS_WEB_HOST") or cls.web_host,
            web_port=env_int(env, "TIMERS_WEB_PORT", cls.web_port),
            metrics_port=_optional_int(env, "TIMERS_METRICS_PORT"),
            advertised_url=env.get("TIMERS_ADVERTISED_URL", "").strip() or None,
            late_policy=policy,
            max_lateness_s=env_float(env, "TIMERS_MAX_LATENESS_S", cls.max_lateness_s),
            clock_tolerance_ms=env_int(env, "TIMERS_CLOCK_TOLERANCE_MS", cls.clock_tolerance_ms),
            join_max_wait_s=env_float(env, "TIMERS_JOIN_MAX_WAIT_S", cls.join_max_wait_s),
            allowed_callback_topics=allowed,
            denied_callback_topics=cls.denied_callback_topics if denied is None else _patterns(denied),
            max_payload_bytes=env_int(env, "TIMERS_MAX_PAYLOAD_BYTES", cls.max_payload_bytes),
            max_due_ahead_s=env_float(env, "TIMERS_MAX_DUE_AHEAD_S", cls.max_due_ahead_s),
            ingest_batch_size=env_int(env, "TIMERS_INGEST_BATCH_SIZE", cls.ingest_batch_size),
            fire_chunk_size=env_int(env, "TIMERS_FIRE_CHUNK_SIZE", cls.fire_chunk_size),
            fire_budget_bytes=env_int(env, "TIMERS_FIRE_BUDGET_BYTES", cls.fire_budget_bytes),
            precise=env_bool(env, "TIMERS_PRECISE", cls.precise),
            admin_token=Secret(token) if (token := env_secret(env, "TIMERS_ADMIN_TOKEN")) else None,
            admin_read_token=Secret(read) if (read := env_secret(env, "TIMERS_ADMIN_READ_TOKEN")) else None,
            admin_open_reads=env_bool(env, "TIMERS_ADMIN_OPEN_READS", cls.admin_open_reads),
            admin_stall_after_s=env_float(env, "TIMERS_ADMIN_STALL_AFTER_S", cls.admin_stall_after_s),
            instance_id=env.get("TIMERS_INSTANCE_ID", "").strip() or None,
            session_timeout_s=_optional_float(env, "TIMERS_SESSION_TIMEOUT_S"),
            heartbeat_s=_optional_float(env, "TIMERS_HEARTBEAT_S"),
            rebalance_timeout_s=_optional_float(env, "TIMERS_REBALANCE_TIMEOUT_S"),
            request_allowed_callback_topics=_patterns(env.get("TIMERS_REQUEST_ALLOWED_CALLBACK_TOPICS", "")),
            schema_registry=SchemaRegistryConfig.from_env(env),
        )
        config.validate()
        return config

    def validate(self) -> None:
        if not re.fullmatch(r"[a-zA-Z0-9._-]+", self.app_id):
            raise ConfigError(f"TIMERS_APP_ID={self.app_id!r}: use letters, digits, '.', '_' or '-'")
        if self.clock_tolerance_ms < 0:
            raise ConfigError("TIMERS_CLOCK_TOLERANCE_MS must be >= 0")
        if self.join_max_wait_s < 0:
            raise ConfigError("TIMERS_JOIN_MAX_WAIT_S must be >= 0 (0: ticks never wait for requests)")
        if not 1 <= self.web_port <= 65535:
            # Not 0 either: the probes and Prometheus need to know the port.
            raise ConfigError(f"TIMERS_WEB_PORT={self.web_port}: use a port number from 1 to 65535")
        if self.metrics_port is not None:
            if not 1 <= self.metrics_port <= 65535:
                raise ConfigError(
                    f"TIMERS_METRICS_PORT={self.metrics_port}: use a port number from 1 to 65535, "
                    "or leave it unset to serve /metrics on the web port only"
                )
            if self.metrics_port == self.web_port:
                raise ConfigError(
                    f"TIMERS_METRICS_PORT={self.metrics_port} is TIMERS_WEB_PORT: use another port, "
                    "or leave it unset (/metrics is served on the web port too)"
                )
        if self.advertised_url is not None:
            _check_advertised_url(self.advertised_url)
        if self.max_due_ahead_s < 0:
            raise ConfigError("TIMERS_MAX_DUE_AHEAD_S must be >= 0 (0 means no limit)")
        if self.max_payload_bytes < 1:
            raise ConfigError("TIMERS_MAX_PAYLOAD_BYTES must be >= 1")
        if self.ingest_batch_size < 1 or self.fire_chunk_size < 1:
            raise ConfigError("TIMERS_INGEST_BATCH_SIZE and TIMERS_FIRE_CHUNK_SIZE must be >= 1")
        if self.fire_budget_bytes < 1024 * 1024:
            raise ConfigError(
                f"TIMERS_FIRE_BUDGET_BYTES={self.fire_budget_bytes}: use at least 1048576 (1 MiB); "
                "the default is 134217728 (128 MiB)"
            )
        if not FireBudget(self.fire_budget_bytes, self.precise).holds(self.max_payload_bytes):
            least = FireBudget.least_for(self.max_payload_bytes, self.precise)
            share = "a quarter of it in precise mode" if self.precise else "half of it"
            raise ConfigError(
                f"TIMERS_FIRE_BUDGET_BYTES={self.fire_budget_bytes} cannot hold a firing of timers as "
                f"large as TIMERS_MAX_PAYLOAD_BYTES={self.max_payload_bytes} (a firing's share is {share}, "
                f"and must hold a piece and one such timer): set TIMERS_FIRE_BUDGET_BYTES to at least "
                f"{least}, or lower TIMERS_MAX_PAYLOAD_BYTES"
            )
        if self.admin_token is not None and len(self.admin_token.get_secret_value()) < 16:
            raise ConfigError("TIMERS_ADMIN_TOKEN is too short: use at least 16 random characters")
        read = self.admin_read_token.get_secret_value() if self.admin_read_token else None
        if read is not None and len(read) < 16:
            raise ConfigError("TIMERS_ADMIN_READ_TOKEN is too short: use at least 16 random characters")
        if read is not None and self.admin_token is not None and read == self.admin_token.get_secret_value():
            raise ConfigError(
                "TIMERS_ADMIN_READ_TOKEN equals TIMERS_ADMIN_TOKEN: its holders could cancel; use another"
            )
        if self.admin_stall_after_s <= 0:
            raise ConfigError("TIMERS_ADMIN_STALL_AFTER_S must be > 0")
        if self.instance_id is not None and not re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", self.instance_id):
            raise ConfigError(
                f"TIMERS_INSTANCE_ID={self.instance_id!r}: use letters, digits, '.', '_' or '-' "
                "(the StatefulSet pod name is a good one)"
            )
        session, heartbeat, rebalance = self.group_timeouts
        if not 0 < heartbeat < session:
            raise ConfigError(
                f"TIMERS_HEARTBEAT_S={heartbeat:g} must be above 0 and below TIMERS_SESSION_TIMEOUT_S="
                f"{session:g} (a third of it or less is safe)"
            )
        if rebalance <= 0:
            raise ConfigError("TIMERS_REBALANCE_TIMEOUT_S must be > 0")

    @property
    def canonical_url(self) -> str:
        """The URL this worker gives the group for its web port (Faust's ``canonical_url``)."""
        return self.advertised_url or f"http://{self.web_host}:{self.web_port}"

    @property
    def group_timeouts(self) -> tuple[float, float, float]:
        """The consumer group's session timeout, heartbeat interval and rebalance timeout (seconds)."""
        profile = self.common.kafka.settings
        return (
            profile.session_timeout_s if self.session_timeout_s is None else self.session_timeout_s,
            profile.heartbeat_s if self.heartbeat_s is None else self.heartbeat_s,
            profile.rebalance_timeout_s if self.rebalance_timeout_s is None else self.rebalance_timeout_s,
        )

    @property
    def max_record_bytes(self) -> int:
        """The producer's ``message.max.bytes``: every record the worker writes fits (bytes)."""
        return self.max_payload_bytes + RECORD_ALLOWANCE_BYTES

    @property
    def changelog_topic(self) -> str:
        """Faust's name for the timer table's changelog."""
        return f"{self.app_id}-{TABLE_NAME}-changelog"

    @cached_property
    def parse_limits(self) -> ParseLimits:
        """What requests are parsed with: the callback-topic policy, size and horizon limits.

        Built once per worker: its Schema Registry check keeps what it learnt across batches.
        """
        topics = self.common.topics
        own = topics.ingress_callback_topics
        if self.request_allowed_callback_topics:
            own = ((topics.request, self.request_allowed_callback_topics), *own)
        return ParseLimits(
            topics=topics,
            app_id=self.app_id,
            allowed_callback_topics=self.allowed_callback_topics,
            denied_callback_topics=self.denied_callback_topics,
            own_callback_topics=own,
            schemas=None if self.schema_registry is None else SchemaCheck(self.schema_registry.client()),
            max_payload_bytes=self.max_payload_bytes,
            max_due_ahead_s=self.max_due_ahead_s,
        )


#: What :meth:`WorkerConfig.from_env` reads besides ``COMMON_ENV`` (docs/configuration.md); the
#: defaults are the dataclass's.
WORKER_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "TIMERS_APP_ID",
        default_of(WorkerConfig, "app_id"),
        "Faust app id = consumer group; prefixes the changelog topic; callback topics <app-id>-* are refused",
    ),
    EnvVar(
        "TIMERS_DATA_DIR",
        default_of(WorkerConfig, "data_dir"),
        "RocksDB tables, a cache of the changelog (rebuilt when lost or too old to catch up)",
    ),
    EnvVar(
        "TIMERS_WEB_HOST",
        default_of(WorkerConfig, "web_host"),
        "address of /metrics, /healthz, /readyz and the admin page and API",
    ),
    EnvVar("TIMERS_WEB_PORT", default_of(WorkerConfig, "web_port"), "port of the same"),
    EnvVar(
        "TIMERS_METRICS_PORT",
        default_of(WorkerConfig, "metrics_port", "the web port only"),
        "also serve /metrics alone on this port, for a NetworkPolicy that admits Prometheus apart",
    ),
    EnvVar(
        "TIMERS_ADVERTISED_URL",
        default_of(WorkerConfig, "advertised_url", "http://<web host>:<web port>"),
        "URL other workers and admin API users reach this worker's web port at",
    ),
    EnvVar(
        "TIMERS_LATE_POLICY",
        default_of(WorkerConfig, "late_policy"),
        "fire, drop or dlq requests later than TIMERS_MAX_LATENESS_S",
    ),
    EnvVar(
        "TIMERS_MAX_LATENESS_S", default_of(WorkerConfig, "max_lateness_s"), "see TIMERS_LATE_POLICY, seconds"
    ),
    EnvVar(
        "TIMERS_CLOCK_TOLERANCE_MS",
        default_of(WorkerConfig, "clock_tolerance_ms"),
        "how far a tick may be ahead of the worker clock",
    ),
    EnvVar(
        "TIMERS_JOIN_MAX_WAIT_S",
        default_of(WorkerConfig, "join_max_wait_s"),
        "how long a tick waits for older requests of its partition before it fires without them, seconds",
    ),
    EnvVar(
        "TIMERS_ALLOWED_CALLBACK_TOPICS",
        default_of(WorkerConfig, "allowed_callback_topics", "any"),
        "comma-separated fnmatch patterns, e.g. orders-*,reminders",
    ),
    EnvVar(
        "TIMERS_REQUEST_ALLOWED_CALLBACK_TOPICS",
        default_of(
            WorkerConfig, "request_allowed_callback_topics", f"{NO_DEFAULT} (TIMERS_ALLOWED_CALLBACK_TOPICS)"
        ),
        "the request topic's own fnmatch patterns of callback topics, comma-separated",
    ),
    EnvVar(
        "TIMERS_DENIED_CALLBACK_TOPICS",
        default_of(WorkerConfig, "denied_callback_topics"),
        "fnmatch patterns refused as callback topics; empty allows them. "
        "The service's own topics, __* and <app-id>-* are always refused",
    ),
    EnvVar(
        "TIMERS_MAX_PAYLOAD_BYTES",
        default_of(WorkerConfig, "max_payload_bytes"),
        "largest timer as stored (else payload-too-large)",
    ),
    EnvVar(
        "TIMERS_MAX_DUE_AHEAD_S",
        default_of(WorkerConfig, "max_due_ahead_s", "none"),
        "timers due further ahead are dead-lettered",
    ),
    EnvVar(
        "TIMERS_INGEST_BATCH_SIZE",
        default_of(WorkerConfig, "ingest_batch_size"),
        "request records per ingest step",
    ),
    EnvVar(
        "TIMERS_FIRE_CHUNK_SIZE",
        default_of(WorkerConfig, "fire_chunk_size"),
        "timers sent, not yet deleted (three overlapping pieces); bounds duplicates after a crash",
    ),
    EnvVar(
        "TIMERS_FIRE_BUDGET_BYTES",
        default_of(WorkerConfig, "fire_budget_bytes"),
        "bytes the worker holds for firing (callbacks built ahead, in flight, in precise windows)",
    ),
    EnvVar(
        "TIMERS_PRECISE",
        default_of(WorkerConfig, "precise"),
        "1: send each timer at its own millisecond instead of at the next tick",
    ),
    EnvVar(
        "TIMERS_ADMIN_TOKEN",
        default_of(WorkerConfig, "admin_token", "no cancel"),
        "admin API bearer token: reads timers, cancels and reschedules; 16+ characters",
    ),
    EnvVar(
        "TIMERS_ADMIN_READ_TOKEN",
        default_of(WorkerConfig, "admin_read_token", "admin token only"),
        "admin API bearer token that only reads timers (list, search, one timer, firings); 16+ characters",
    ),
    EnvVar("TIMERS_ADMIN_TOKEN_FILE", NO_DEFAULT, "file holding the admin token, instead of the above"),
    EnvVar("TIMERS_ADMIN_READ_TOKEN_FILE", NO_DEFAULT, "file holding the read token, instead of the above"),
    EnvVar(
        "TIMERS_ADMIN_OPEN_READS",
        default_of(WorkerConfig, "admin_open_reads"),
        "1: timers are read without a token by whoever reaches the web port",
    ),
    EnvVar(
        "TIMERS_ADMIN_STALL_AFTER_S",
        default_of(WorkerConfig, "admin_stall_after_s"),
        "a partition's watermark this far behind shows red, seconds",
    ),
    EnvVar(
        "TIMERS_INSTANCE_ID",
        default_of(WorkerConfig, "instance_id", "dynamic membership"),
        "static member name: the pod name",
    ),
    # None in the dataclass: the broker profile's (ktimers.config.ProfileSettings).
    EnvVar(
        "TIMERS_SESSION_TIMEOUT_S",
        profile_default("session_timeout_s"),
        "consumer group session timeout, seconds",
    ),
    EnvVar("TIMERS_HEARTBEAT_S", profile_default("heartbeat_s"), "heartbeat interval, seconds"),
    EnvVar(
        "TIMERS_REBALANCE_TIMEOUT_S", profile_default("rebalance_timeout_s"), "rebalance timeout, seconds"
    ),
    *REGISTRY_ENV,
)


def _optional_int(env: Env, name: str) -> int | None:
    return env_int(env, name, 0) if env.get(name, "").strip() else None


def _optional_float(env: Env, name: str) -> float | None:
    return env_float(env, name, 0.0) if env.get(name, "").strip() else None


def _patterns(text: str) -> tuple[str, ...]:
    """Comma-separated fnmatch patterns; empty items are dropped."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _check_advertised_url(url: str) -> None:
    """An absolute http(s) URL of a host and port, nothing after: what Faust's router expects."""
    problem = f"TIMERS_ADVERTISED_URL={url!r}: use http://<host>:<port>, e.g. http://timers-worker-0.timers-worker.ns.svc:6066"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(problem) from exc
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
        or parts.password is not None
        or any(c.isspace() for c in url)
    ):
        raise ConfigError(problem)
