"""Shared configuration from the environment: Kafka connection, broker profile, topic names."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ktimers.config import (
    KAFKA_ENV,
    MAX_SECRET_FILE_BYTES,
    TOPICS_ENV,
    BrokerProfile,
    CommonConfig,
    KafkaConfig,
    ProfileSettings,
    TopicsConfig,
    default_of,
    env_secret,
    shown,
)
from ktimers.errors import ConfigError

PASSWORD = "pa55-w0rd-xyz"  # a made-up value, never a real credential

SASL_ENV = {
    "KAFKA_BOOTSTRAP_SERVERS": "b1:9093,b2:9093",
    "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "KAFKA_SASL_USERNAME": "timers",
    "KAFKA_SASL_PASSWORD": PASSWORD,
    "KAFKA_SSL_CA_LOCATION": "/etc/kafka/ca.pem",
}


def test_kafka_defaults() -> None:
    kafka = KafkaConfig.from_env({})

    assert kafka.profile is BrokerProfile.CLUSTER
    assert kafka.librdkafka() == {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "PLAINTEXT"}


def test_empty_variables_count_as_unset() -> None:
    kafka = KafkaConfig.from_env({"KAFKA_BOOTSTRAP_SERVERS": "", "KAFKA_SECURITY_PROTOCOL": ""})

    assert kafka.librdkafka()["bootstrap.servers"] == "127.0.0.1:9092"
    assert kafka.security_protocol == "PLAINTEXT"


def test_reads_os_environ_when_no_env_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka.internal:9092")

    assert KafkaConfig.from_env().bootstrap_servers == "kafka.internal:9092"


def test_sasl_settings_become_librdkafka_keys() -> None:
    assert KafkaConfig.from_env(SASL_ENV).librdkafka() == {
        "bootstrap.servers": "b1:9093,b2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "timers",
        "sasl.password": PASSWORD,
        "ssl.ca.location": "/etc/kafka/ca.pem",
    }


def test_protocol_is_case_insensitive() -> None:
    kafka = KafkaConfig.from_env({"KAFKA_SECURITY_PROTOCOL": "ssl"})

    assert kafka.librdkafka()["security.protocol"] == "SSL"


def test_password_never_shows_in_repr_or_str() -> None:
    common = CommonConfig.from_env(SASL_ENV)
    assert common.kafka.sasl_password is not None

    for text in (repr(common), str(common), repr(common.kafka), str(common.kafka.sasl_password)):
        assert PASSWORD not in text
    assert "**********" in repr(common.kafka)
    assert common.kafka.sasl_password.get_secret_value() == PASSWORD


def test_unknown_protocol_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        KafkaConfig.from_env({"KAFKA_SECURITY_PROTOCOL": "TLS"})

    message = str(info.value)
    assert "KAFKA_SECURITY_PROTOCOL='TLS'" in message
    for choice in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        assert choice in message


def test_sasl_without_mechanism_says_which_variable_to_set() -> None:
    with pytest.raises(ConfigError, match="needs KAFKA_SASL_MECHANISM"):
        KafkaConfig.from_env({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})


@pytest.mark.parametrize("value", ["embedded", "EMBEDDED", "Embedded"])
def test_embedded_profile(value: str) -> None:
    kafka = KafkaConfig.from_env({"TIMERS_BROKER_PROFILE": value})

    assert kafka.profile is BrokerProfile.EMBEDDED
    assert kafka.settings == ProfileSettings.for_profile(BrokerProfile.EMBEDDED)


def test_unknown_profile_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="TIMERS_BROKER_PROFILE='tansu' is not one of: cluster, embedded"):
        KafkaConfig.from_env({"TIMERS_BROKER_PROFILE": "tansu"})


def test_profiles_differ_as_documented() -> None:
    cluster = KafkaConfig.from_env({}).settings
    embedded = KafkaConfig.from_env({"TIMERS_BROKER_PROFILE": "embedded"}).settings

    # Short group timeouts on Tansu (a restarted worker waits a whole session: Tansu
    # never hears a LeaveGroup); on a cluster, a dead worker is noticed within Kafka's
    # smallest default session (6 s) and its partitions move within 10 s.
    assert (embedded.session_timeout_s, embedded.heartbeat_s, embedded.rebalance_timeout_s) == (6.0, 0.5, 6.0)
    assert (cluster.session_timeout_s, cluster.heartbeat_s, cluster.rebalance_timeout_s) == (6.0, 0.5, 20.0)
    # Tansu breaks static members' groups; Kafka keeps a restarted member's partitions.
    assert cluster.static_membership and not embedded.static_membership
    # The changelog workaround for Tansu's ListOffsets (quirk 1) stays off on a real cluster.
    # One broker in Tansu.
    assert (embedded.replication_factor, cluster.replication_factor) == (1, 3)
    for settings in (embedded, cluster):
        assert settings.heartbeat_s < settings.session_timeout_s


def test_topic_defaults() -> None:
    topics = TopicsConfig.from_env({})

    assert (topics.oscillator, topics.request, topics.events, topics.dlq) == (
        "oscillator",
        "timer-request",
        "timer-events",
        "timer-request-dlq",
    )
    assert topics.partitions == 4


def test_topic_overrides() -> None:
    topics = TopicsConfig.from_env(
        {
            "TIMERS_TOPIC_OSCILLATOR": "ticks",
            "TIMERS_TOPIC_REQUEST": "requests",
            "TIMERS_TOPIC_EVENTS": "events",
            "TIMERS_TOPIC_DLQ": "dead",
            "TIMERS_PARTITIONS": "12",
        }
    )

    assert (topics.oscillator, topics.request, topics.events, topics.dlq, topics.partitions) == (
        "ticks",
        "requests",
        "events",
        "dead",
        12,
    )


def test_own_topics_are_the_four_service_topics() -> None:
    topics = TopicsConfig.from_env({"TIMERS_TOPIC_REQUEST": "requests"})

    assert topics.own == {"oscillator", "requests", "timer-events", "timer-request-dlq"}
    assert "timer-request" not in topics.own


@pytest.mark.parametrize("value", ["four", "4.0", "0", "-2"])
def test_bad_partition_count_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="TIMERS_PARTITIONS"):
        TopicsConfig.from_env({"TIMERS_PARTITIONS": value})


def test_common_config_reads_both_parts() -> None:
    common = CommonConfig.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "TIMERS_TOPIC_DLQ": "dead"})

    assert common.kafka.bootstrap_servers == "k:9092"
    assert common.topics.dlq == "dead"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3600.0, "3600"),
        (0.5, "0.5"),
        (1_000_000, "1000000"),
        (False, "0"),
        (True, "1"),
        (None, "—"),
        (("orders-*", "reminders"), "orders-*,reminders"),
        (BrokerProfile.EMBEDDED, "embedded"),
    ],
)
def test_a_default_is_shown_as_one_would_set_it(value: object, text: str) -> None:
    assert shown(value) == text


def test_a_shown_default_is_read_back_as_the_default() -> None:
    for var in KAFKA_ENV + TOPICS_ENV:
        if var.default != "—":
            assert CommonConfig.from_env({var.name: var.default}) == CommonConfig.from_env({}), var.name


def test_a_note_follows_the_default_or_stands_for_an_empty_one() -> None:
    assert default_of(TopicsConfig, "partitions", "per topic") == "4 (per topic)"
    assert default_of(TopicsConfig, "ingress", "none") == "none"
    assert default_of(KafkaConfig, "sasl_password", "never logged") == "— (never logged)"


def _file_env(tmp_path: Path, username: bytes, password: bytes) -> dict[str, str]:
    """SASL_ENV with the credentials in files, as a Secret mounted as a volume gives them."""
    (tmp_path / "username").write_bytes(username)
    (tmp_path / "password").write_bytes(password)
    env = {k: v for k, v in SASL_ENV.items() if k not in ("KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD")}
    return {
        **env,
        "KAFKA_SASL_USERNAME_FILE": str(tmp_path / "username"),
        "KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "password"),
    }


def test_sasl_credentials_are_read_from_mounted_files(tmp_path: Path) -> None:
    # `kubectl create secret --from-file` keeps the file's trailing newline.
    env = _file_env(tmp_path, b"timers\n", PASSWORD.encode() + b"\n")
    assert KafkaConfig.from_env(env) == KafkaConfig.from_env(SASL_ENV)
    # Every component builds its connection here: the worker, oscillator, jobs and CLI alike.
    assert CommonConfig.from_env(env).kafka.librdkafka()["sasl.password"] == PASSWORD


def test_a_secret_in_both_the_environment_and_a_file_is_refused(tmp_path: Path) -> None:
    env = {**_file_env(tmp_path, b"timers", b"other"), "KAFKA_SASL_PASSWORD": PASSWORD}
    with pytest.raises(ConfigError, match="KAFKA_SASL_PASSWORD and KAFKA_SASL_PASSWORD_FILE"):
        KafkaConfig.from_env(env)


def test_an_unreadable_secret_file_names_the_variable_and_the_fix(tmp_path: Path) -> None:
    env = {**SASL_ENV, "KAFKA_SASL_PASSWORD": "", "KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "missing")}
    with pytest.raises(ConfigError, match="KAFKA_SASL_PASSWORD_FILE=.*mount the Secret"):
        KafkaConfig.from_env(env)


@hypothesis_settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=MAX_SECRET_FILE_BYTES + 2))
def test_any_secret_file_gives_a_secret_or_a_clear_rejection(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "secret"
    path.write_bytes(content)
    try:
        value = env_secret({"X_FILE": str(path)}, "X")
    except ConfigError as exc:
        assert "X_FILE=" in str(exc)
        return
    assert value is None or value == content.decode().strip()
