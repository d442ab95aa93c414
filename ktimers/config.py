"""Typed configuration shared by every component, built once from the environment.

One Kafka connection config (bootstrap, SASL/TLS) serves the oscillator, the
worker, the client and the jobs. The *broker profile* gathers every workaround
for the embedded Tansu broker in one place: it is on only when
``TIMERS_BROKER_PROFILE=embedded`` (set by ``make run`` and the tests) and never
silently carried to a real cluster.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from ktimers.errors import ConfigError

Env = Mapping[str, str]

#: ``KAFKA_SSL_CA_LOCATION=probe``: librdkafka's word for "the system's CA store" (the chart
#: sets it when TLS needs no CA of its own); any other value names a CA bundle file.
SYSTEM_CA_STORE = "probe"
#: The worker's default ``TIMERS_APP_ID``: its consumer group and the prefix of its internal topics.
DEFAULT_APP_ID = "timers"


@dataclass(frozen=True)
class EnvVar:
    """A variable a component reads, as ``--help`` and docs/configuration.md show it.

    Each config module lists the variables its ``from_env`` reads next to it; a test
    checks the lists against what ``from_env`` really reads and against the docs.
    """

    name: str
    #: As the docs show it (see :func:`default_of`); "—" when unset means "not used".
    default: str
    meaning: str


NO_DEFAULT = "—"


def shown(value: object) -> str:
    """A default as ``--help`` and docs/configuration.md show it: as one would set it."""
    if value is None:
        return NO_DEFAULT
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, tuple):
        return ",".join(shown(item) for item in value)
    return str(value)


def default_of(config: type, name: str, note: str = "") -> str:
    """The default of field ``name`` of the dataclass ``config``, shown (see :func:`shown`).

    ``note`` says what the value means, after it: ``0 (none)``; for an empty default the
    note alone is shown (``any``). The dataclass is the one place a default is written.
    """
    [spec] = [f for f in dataclasses.fields(config) if f.name == name]
    value = spec.default if spec.default_factory is dataclasses.MISSING else spec.default_factory()
    text = shown(value)
    if not text:
        return note
    return f"{text} ({note})" if note else text


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


def profile_default(name: str) -> str:
    """A :class:`ProfileSettings` value as shown: the cluster's, and the embedded broker's if it differs."""
    cluster = getattr(ProfileSettings.for_profile(BrokerProfile.CLUSTER), name)
    embedded = getattr(ProfileSettings.for_profile(BrokerProfile.EMBEDDED), name)
    if cluster == embedded:
        return shown(cluster)
    return f"{shown(cluster)} (embedded: {shown(embedded)})"


def _get(env: Env, name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else default


#: Largest secret file read (bytes): a password, token or ``user:password``, never a bundle.
MAX_SECRET_FILE_BYTES = 64 * 1024


def env_secret(env: Env, name: str) -> str | None:
    """A secret from ``name``, or from the file named by ``name + "_FILE"`` (a mounted Secret).

    A file keeps the secret out of the process environment (``/proc/<pid>/environ``, crash
    dumps, ``kubectl describe``). Its content is taken as it is, less surrounding whitespace
    (``kubectl create secret --from-file`` keeps a trailing newline). Both set is refused:
    which one wins would be a guess.
    """
    value = _get(env, name)
    path = _get(env, f"{name}_FILE")
    if path is None:
        return value
    if value is not None:
        raise ConfigError(
            f"{name} and {name}_FILE are both set: keep one (the file keeps it out of the environment)"
        )
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"{name}_FILE={path!r} cannot be read ({exc.strerror}): mount the Secret there"
        ) from exc
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(
            f"{name}_FILE={path!r} is larger than {MAX_SECRET_FILE_BYTES} bytes: not a secret value"
        )
    try:
        text = raw.decode().strip()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}_FILE={path!r} is not UTF-8 text") from exc
    return text or None


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


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach Kafka. Environment: ``KAFKA_*`` (docs/configuration.md)."""

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
        password = env_secret(env, "KAFKA_SASL_PASSWORD")
        protocol = (_get(env, "KAFKA_SECURITY_PROTOCOL", cls.security_protocol) or "").upper()
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
        profile = env_choice(env, "TIMERS_BROKER_PROFILE", BrokerProfile, cls.profile)
        assert isinstance(profile, BrokerProfile)  # noqa: S101 - narrows env_choice's return
        return cls(
            bootstrap_servers=_get(env, "KAFKA_BOOTSTRAP_SERVERS", cls.bootstrap_servers) or "",
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=env_secret(env, "KAFKA_SASL_USERNAME"),
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

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a Python client (aiokafka, under Faust); None without TLS.

        It trusts what librdkafka's clients trust with the same settings: the system's CA
        store for ``probe`` or no location, else the CA bundle file named. Raises
        :class:`ConfigError` when that file cannot be read.
        """
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        location = self.ssl_ca_location
        if location is None or location == SYSTEM_CA_STORE:
            return ssl.create_default_context()
        try:
            return ssl.create_default_context(cafile=location)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"KAFKA_SSL_CA_LOCATION={location!r}: cannot read a CA bundle there ({exc}). "
                f"Name a PEM file of CA certificates, or {SYSTEM_CA_STORE} for the system's CA store"
            ) from exc


#: What :meth:`KafkaConfig.from_env` reads.
KAFKA_ENV: tuple[EnvVar, ...] = (
    EnvVar("KAFKA_BOOTSTRAP_SERVERS", default_of(KafkaConfig, "bootstrap_servers"), "brokers"),
    EnvVar(
        "KAFKA_SECURITY_PROTOCOL",
        default_of(KafkaConfig, "security_protocol"),
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    ),
    EnvVar(
        "KAFKA_SASL_MECHANISM",
        default_of(KafkaConfig, "sasl_mechanism"),
        "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    ),
    EnvVar("KAFKA_SASL_USERNAME", default_of(KafkaConfig, "sasl_username"), "SASL user name"),
    EnvVar("KAFKA_SASL_PASSWORD", default_of(KafkaConfig, "sasl_password"), "SASL password (never logged)"),
    EnvVar("KAFKA_SASL_USERNAME_FILE", NO_DEFAULT, "file holding the SASL user name, instead of the above"),
    EnvVar("KAFKA_SASL_PASSWORD_FILE", NO_DEFAULT, "file holding the SASL password, instead of the above"),
    EnvVar(
        "KAFKA_SSL_CA_LOCATION",
        default_of(KafkaConfig, "ssl_ca_location"),
        f"CA bundle file for TLS; {SYSTEM_CA_STORE}: the system's CA store",
    ),
    EnvVar(
        "TIMERS_BROKER_PROFILE", default_of(KafkaConfig, "profile"), "embedded turns on the Tansu workarounds"
    ),
)


class IngressFormat(enum.Enum):
    """The request format an ingress topic carries (docs/request-topics.md)."""

    NATIVE = "native"  # Future / Cancel / FutureBatch protobuf, as on `timer-request`
    ETF1 = "etf1"  # kafka-message-scheduler: payload + scheduler-* headers
    COUNTDOWN = "countdown"  # JSON {"topic", "message", "countdown"}


#: What a callback-topic pattern may hold: the characters of topic names and fnmatch's ``*?[]!``.
_CALLBACK_PATTERN = re.compile(r"[a-zA-Z0-9._*?\[\]!-]+")

#: One request topic of ``TIMERS_INGRESS_TOPICS``: its name, its format, and its own
#: callback-topic patterns (None: it has none, ``TIMERS_ALLOWED_CALLBACK_TOPICS`` applies).
IngressTopic = tuple[str, IngressFormat, tuple[str, ...] | None]


def parse_ingress_topics(raw: str) -> tuple[IngressTopic, ...]:
    """``"schedules=etf1,team-a=native:team-a.*:audit"`` → ((topic, format, patterns), ...), in order.

    Each comma-separated item is ``topic=format``, optionally followed by the topic's
    own callback-topic patterns (fnmatch), each after a ``:``.
    """
    name = "TIMERS_INGRESS_TOPICS"
    items: list[IngressTopic] = []
    allowed = ", ".join(f.value for f in IngressFormat)
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        topic, sep, rest = (s.strip() for s in item.partition("="))
        fmt, colon, patterns_text = (s.strip() for s in rest.partition(":"))
        if not sep or not topic or not fmt:
            raise ConfigError(
                f"{name}: {item!r} is not topic=format or topic=format:pattern:... (formats: {allowed})"
            )
        try:
            ingress_format = IngressFormat(fmt.lower())
        except ValueError as exc:
            raise ConfigError(f"{name}: {item!r} names an unknown format (formats: {allowed})") from exc
        patterns = None
        if colon:
            patterns = tuple(p.strip() for p in patterns_text.split(":"))
            bad = next((p for p in patterns if not _CALLBACK_PATTERN.fullmatch(p)), None)
            if bad is not None:
                raise ConfigError(
                    f"{name}: {item!r}: {bad!r} is not a callback-topic pattern (topic name characters "
                    "and * ? [ ] !); give at least one after the ':', or no ':' to use "
                    "TIMERS_ALLOWED_CALLBACK_TOPICS"
                )
        items.append((topic, ingress_format, patterns))
    topics = [topic for topic, _, _ in items]
    if len(set(topics)) != len(topics):
        raise ConfigError(f"{name}: a topic is listed twice in {raw!r}")
    return tuple(items)


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
    #: (topic, fnmatch patterns) of the extra request topics that name their own
    #: callback topics in ``TIMERS_INGRESS_TOPICS`` (``topic=format:pattern:...``).
    ingress_callback_topics: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_env(cls, env: Env | None = None) -> TopicsConfig:
        env = os.environ if env is None else env
        ingress = parse_ingress_topics(_get(env, "TIMERS_INGRESS_TOPICS", "") or "")
        topics = cls(
            oscillator=_get(env, "TIMERS_TOPIC_OSCILLATOR", cls.oscillator) or "",
            request=_get(env, "TIMERS_TOPIC_REQUEST", cls.request) or "",
            events=_get(env, "TIMERS_TOPIC_EVENTS", cls.events) or "",
            dlq=_get(env, "TIMERS_TOPIC_DLQ", cls.dlq) or "",
            partitions=env_int(env, "TIMERS_PARTITIONS", cls.partitions),
            ingress=tuple((topic, fmt) for topic, fmt, _ in ingress),
            ingress_callback_topics=tuple((t, own) for t, _, own in ingress if own is not None),
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

    @functools.cached_property
    def own(self) -> frozenset[str]:
        """The service's own topics: never a valid callback target (checked for every timer a
        client builds, so computed once)."""
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


#: What :meth:`TopicsConfig.from_env` reads.
TOPICS_ENV: tuple[EnvVar, ...] = (
    EnvVar("TIMERS_TOPIC_OSCILLATOR", default_of(TopicsConfig, "oscillator"), "topic of the ticks"),
    EnvVar(
        "TIMERS_TOPIC_REQUEST", default_of(TopicsConfig, "request"), "topic of the requests (native format)"
    ),
    EnvVar(
        "TIMERS_TOPIC_EVENTS",
        default_of(TopicsConfig, "events"),
        "topic of the fired/cancelled/rejected events",
    ),
    EnvVar("TIMERS_TOPIC_DLQ", default_of(TopicsConfig, "dlq"), "dead-letter topic of the requests"),
    EnvVar(
        "TIMERS_PARTITIONS", default_of(TopicsConfig, "partitions"), "partitions for `timers topics create`"
    ),
    EnvVar(
        "TIMERS_INGRESS_TOPICS",
        default_of(TopicsConfig, "ingress", NO_DEFAULT),
        "more request topics and their formats, topic=format comma-separated (native, etf1, countdown); "
        "topic=format:pattern:... gives a topic its own callback-topic patterns",
    ),
)


#: What :meth:`CommonConfig.from_env` reads: every component's Kafka connection and topics.
COMMON_ENV: tuple[EnvVar, ...] = KAFKA_ENV + TOPICS_ENV

#: What ``TIMERS_LOG_LEVEL`` may be, as the logging module names the levels.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

#: Read by the services (worker, oscillator, task worker) besides ``COMMON_ENV``.
LOG_LEVEL_ENV = EnvVar("TIMERS_LOG_LEVEL", "info", "log level: debug, info, warning or error")


def env_log_level(env: Env, default: str = "INFO") -> str:
    """``TIMERS_LOG_LEVEL`` as a :mod:`logging` level name; :class:`ConfigError` for another word."""
    level = (_get(env, LOG_LEVEL_ENV.name, default) or default).upper()
    if level not in LOG_LEVELS:
        raise ConfigError(
            f"{LOG_LEVEL_ENV.name}={level.lower()!r}: use one of {', '.join(v.lower() for v in LOG_LEVELS)}"
        )
    return level


#: The table of the variables "shared by all components" in docs/configuration.md.
SHARED_ENV: tuple[EnvVar, ...] = COMMON_ENV + (LOG_LEVEL_ENV,)


@dataclass(frozen=True)
class CommonConfig:
    """What every component needs: where Kafka is and what the topics are called."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)

    @classmethod
    def from_env(cls, env: Env | None = None) -> CommonConfig:
        return cls(kafka=KafkaConfig.from_env(env), topics=TopicsConfig.from_env(env))
