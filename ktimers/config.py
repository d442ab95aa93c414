"""Typed configuration shared by every component, built once from the environment.

One Kafka connection config (bootstrap, SASL/TLS) serves the oscillator, the
worker, the client and the jobs. The *broker profile* gathers every workaround
for the embedded Tansu broker in one place: it is on only when
``TIMERS_BROKER_PROFILE=embedded`` (set by ``make run`` and the tests) and never
silently carried to a real cluster.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ktimers.errors import ConfigError

Env = Mapping[str, str]


@dataclass(frozen=True)
class EnvVar:
    """A variable a component reads, as ``--help`` and the README's "Configuration" tables show it.

    Each config module lists the variables its ``from_env`` reads next to it; a test
    checks the lists against what ``from_env`` really reads and against the README.
    """

    name: str
    #: As the README shows it; "—" when unset means "not used".
    default: str
    meaning: str


NO_DEFAULT = "—"


class Secret:
    """A string that never shows up in repr, str or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class BrokerProfile(enum.Enum):
    """Which kind of broker we talk to. See :class:`ProfileSettings`."""

    CLUSTER = "cluster"
    EMBEDDED = "embedded"


@dataclass(frozen=True)
class ProfileSettings:
    """Settings that differ between a real Kafka cluster and the embedded Tansu broker.

    The embedded values work around Tansu 0.6.0's behaviour, measured against it:

    * ``session_timeout_s``/``heartbeat_s``/``rebalance_timeout_s``: aiokafka never
      sends LeaveGroup to Tansu, so a dead worker's member stays until its session
      expires (a restarted worker removes its own at start:
      ``futures/worker/membership.py``); Tansu holds every join for half the
      session timeout. Short timeouts keep failover to seconds.
    * ``replication_factor``: Tansu has one broker.
    * ``short_fetch_wait``: Tansu holds a fetch for its full max wait even when
      data arrives (Faust's is 1.5 s, which delayed ticks); the worker consumes
      through a transport with a 10 ms wait instead.
    * ``static_membership``: whether ``TIMERS_INSTANCE_ID`` is sent as
      ``group.instance.id``. Tansu 0.6.0 drops a static member right after its
      first sync, and its group never forms again once a member is killed.

    The cluster timeouts are set for failover in seconds: a SIGKILLed worker is
    noticed after the session timeout (6 s, the least a stock Kafka broker accepts:
    ``group.min.session.timeout.ms``), the survivors hear of it at their next
    heartbeat (0.5 s), and a survivor stuck in its revocation is expelled after the
    rebalance timeout (20 s) rather than holding the whole group. Heartbeats run in
    Faust's consumer thread, not in the event loop that fires timers. A shorter
    heartbeat loosens nothing: a member is still expelled only after 6 s without
    one (12 missed at 0.5 s, 6 at 1 s); it costs a broker two small requests a
    second per worker, and takes up to 0.5 s off a takeover.
    """

    session_timeout_s: float
    heartbeat_s: float
    rebalance_timeout_s: float
    replication_factor: int
    short_fetch_wait: bool
    static_membership: bool

    @classmethod
    def for_profile(cls, profile: BrokerProfile) -> ProfileSettings:
        if profile is BrokerProfile.EMBEDDED:
            return cls(
                session_timeout_s=6.0,
                heartbeat_s=0.5,
                rebalance_timeout_s=6.0,
                replication_factor=1,
                short_fetch_wait=True,
                static_membership=False,
            )
        return cls(
            session_timeout_s=6.0,
            heartbeat_s=0.5,
            rebalance_timeout_s=20.0,
            replication_factor=3,
            short_fetch_wait=False,
            static_membership=True,
        )


def _get(env: Env, name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else default


def env_int(env: Env, name: str, default: int) -> int:
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not an integer") from exc


def env_float(env: Env, name: str, default: float) -> float:
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a number") from exc


def env_bool(env: Env, name: str, default: bool) -> bool:
    raw = _get(env, name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: use 1/true/yes/on or 0/false/no/off")


def env_choice(env: Env, name: str, enum_type: type[enum.Enum], default: enum.Enum) -> enum.Enum:
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        return enum_type(raw.lower())
    except ValueError as exc:
        allowed = ", ".join(str(m.value) for m in enum_type)
        raise ConfigError(f"{name}={raw!r} is not one of: {allowed}") from exc


#: What :meth:`KafkaConfig.from_env` reads.
KAFKA_ENV: tuple[EnvVar, ...] = (
    EnvVar("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092", "brokers"),
    EnvVar("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    EnvVar("KAFKA_SASL_MECHANISM", NO_DEFAULT, "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    EnvVar("KAFKA_SASL_USERNAME", NO_DEFAULT, "SASL user name"),
    EnvVar("KAFKA_SASL_PASSWORD", NO_DEFAULT, "SASL password (never logged)"),
    EnvVar("KAFKA_SSL_CA_LOCATION", NO_DEFAULT, "CA bundle for TLS"),
    EnvVar("TIMERS_BROKER_PROFILE", "cluster", "embedded turns on the Tansu workarounds"),
)


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach Kafka. Environment: ``KAFKA_*`` (see README, "Configuration")."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    profile: BrokerProfile = BrokerProfile.CLUSTER

    @classmethod
    def from_env(cls, env: Env | None = None) -> KafkaConfig:
        env = os.environ if env is None else env
        password = _get(env, "KAFKA_SASL_PASSWORD")
        protocol = (_get(env, "KAFKA_SECURITY_PROTOCOL", "PLAINTEXT") or "").upper()
        if protocol not in {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}:
            raise ConfigError(
                f"KAFKA_SECURITY_PROTOCOL={protocol!r}: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
            )
        mechanism = _get(env, "KAFKA_SASL_MECHANISM")
        if protocol.startswith("SASL") and not mechanism:
            raise ConfigError(
                f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_MECHANISM "
                "(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
            )
        profile = env_choice(env, "TIMERS_BROKER_PROFILE", BrokerProfile, BrokerProfile.CLUSTER)
        assert isinstance(profile, BrokerProfile)  # noqa: S101 - narrows env_choice's return
        return cls(
            bootstrap_servers=_get(env, "KAFKA_BOOTSTRAP_SERVERS", cls.bootstrap_servers) or "",
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=_get(env, "KAFKA_SASL_USERNAME"),
            sasl_password=Secret(password) if password else None,
            ssl_ca_location=_get(env, "KAFKA_SSL_CA_LOCATION"),
            profile=profile,
        )

    @property
    def settings(self) -> ProfileSettings:
        return ProfileSettings.for_profile(self.profile)

    def librdkafka(self) -> dict[str, str | int | float | bool]:
        """Connection settings for any confluent-kafka client."""
        conf: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        return conf


class IngressFormat(enum.Enum):
    """The request format an ingress topic carries (README, "Compatible formats")."""

    NATIVE = "native"  # Future / Cancel / FutureBatch protobuf, as on `timer-request`
    ETF1 = "etf1"  # kafka-message-scheduler: payload + scheduler-* headers
    COUNTDOWN = "countdown"  # JSON {"topic", "message", "countdown"}


def parse_ingress(raw: str, name: str = "TIMERS_INGRESS_TOPICS") -> tuple[tuple[str, IngressFormat], ...]:
    """``"schedules=etf1,delays=countdown"`` → ((topic, format), ...), in the order given."""
    pairs: list[tuple[str, IngressFormat]] = []
    allowed = ", ".join(f.value for f in IngressFormat)
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        topic, sep, fmt = (s.strip() for s in item.partition("="))
        if not sep or not topic or not fmt:
            raise ConfigError(f"{name}: {item!r} is not topic=format (formats: {allowed})")
        try:
            pairs.append((topic, IngressFormat(fmt.lower())))
        except ValueError as exc:
            raise ConfigError(f"{name}: {item!r} names an unknown format (formats: {allowed})") from exc
    topics = [topic for topic, _ in pairs]
    if len(set(topics)) != len(topics):
        raise ConfigError(f"{name}: a topic is listed twice in {raw!r}")
    return tuple(pairs)


#: What :meth:`TopicsConfig.from_env` reads.
TOPICS_ENV: tuple[EnvVar, ...] = (
    EnvVar("TIMERS_TOPIC_OSCILLATOR", "oscillator", "topic of the ticks"),
    EnvVar("TIMERS_TOPIC_REQUEST", "timer-request", "topic of the requests (native format)"),
    EnvVar("TIMERS_TOPIC_EVENTS", "timer-events", "topic of the fired/cancelled/rejected events"),
    EnvVar("TIMERS_TOPIC_DLQ", "timer-request-dlq", "dead-letter topic of the requests"),
    EnvVar("TIMERS_PARTITIONS", "4", "partitions for `timers topics create`"),
    EnvVar(
        "TIMERS_INGRESS_TOPICS",
        NO_DEFAULT,
        "more request topics and their formats, topic=format comma-separated (native, etf1, countdown)",
    ),
)


@dataclass(frozen=True)
class TopicsConfig:
    """Topic names. Environment: ``TIMERS_TOPIC_*`` and ``TIMERS_INGRESS_TOPICS``."""

    oscillator: str = "oscillator"
    request: str = "timer-request"
    events: str = "timer-events"
    dlq: str = "timer-request-dlq"
    partitions: int = 4
    #: Extra request topics and the format each carries, co-partitioned with
    #: ``oscillator`` like ``request`` (which always carries the native format).
    ingress: tuple[tuple[str, IngressFormat], ...] = ()

    @classmethod
    def from_env(cls, env: Env | None = None) -> TopicsConfig:
        env = os.environ if env is None else env
        topics = cls(
            oscillator=_get(env, "TIMERS_TOPIC_OSCILLATOR", cls.oscillator) or "",
            request=_get(env, "TIMERS_TOPIC_REQUEST", cls.request) or "",
            events=_get(env, "TIMERS_TOPIC_EVENTS", cls.events) or "",
            dlq=_get(env, "TIMERS_TOPIC_DLQ", cls.dlq) or "",
            partitions=env_int(env, "TIMERS_PARTITIONS", cls.partitions),
            ingress=parse_ingress(_get(env, "TIMERS_INGRESS_TOPICS", "") or ""),
        )
        if topics.partitions < 1:
            raise ConfigError(f"TIMERS_PARTITIONS={topics.partitions}: must be at least 1")
        clash = {t for t, _ in topics.ingress} & {
            topics.oscillator,
            topics.request,
            topics.events,
            topics.dlq,
        }
        if clash:
            raise ConfigError(
                f"TIMERS_INGRESS_TOPICS: {', '.join(sorted(clash))} is already one of the service's topics"
            )
        return topics

    @property
    def own(self) -> frozenset[str]:
        """The service's own topics: never a valid callback target."""
        return frozenset({self.oscillator, self.request, self.events, self.dlq, *self.ingress_formats})

    @property
    def ingress_formats(self) -> dict[str, IngressFormat]:
        """Every request topic the worker consumes → its format; ``request`` first."""
        return {self.request: IngressFormat.NATIVE, **dict(self.ingress)}

    def format_of(self, topic: str) -> IngressFormat | None:
        """The format ``topic`` carries, or None when it is not a request topic."""
        if topic == self.request:
            return IngressFormat.NATIVE
        for name, fmt in self.ingress:
            if name == topic:
                return fmt
        return None


#: What :meth:`CommonConfig.from_env` reads: every component's Kafka connection and topics.
COMMON_ENV: tuple[EnvVar, ...] = KAFKA_ENV + TOPICS_ENV

#: Read by the services (worker, oscillator, task worker) besides ``COMMON_ENV``.
LOG_LEVEL_ENV = EnvVar("TIMERS_LOG_LEVEL", "info", "log level: debug, info, warning or error")

#: The README's table of the variables "shared by all components".
SHARED_ENV: tuple[EnvVar, ...] = COMMON_ENV + (LOG_LEVEL_ENV,)


@dataclass(frozen=True)
class CommonConfig:
    """What every component needs: where Kafka is and what the topics are called."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)

    @classmethod
    def from_env(cls, env: Env | None = None) -> CommonConfig:
        return cls(kafka=KafkaConfig.from_env(env), topics=TopicsConfig.from_env(env))
