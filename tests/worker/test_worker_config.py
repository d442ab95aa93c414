"""WorkerConfig.from_env: every TIMERS_* setting, and errors that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futures.worker.app import create_app
from futures.worker.config import LatePolicy, WorkerConfig
from ktimers.config import BrokerProfile, Secret
from ktimers.errors import ConfigError

FULL_ENV = {
    "KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9092,kafka-2:9092",
    "TIMERS_BROKER_PROFILE": "embedded",
    "TIMERS_TOPIC_OSCILLATOR": "shop-osc",
    "TIMERS_TOPIC_REQUEST": "shop-req",
    "TIMERS_TOPIC_EVENTS": "shop-events",
    "TIMERS_TOPIC_DLQ": "shop-dlq",
    "TIMERS_PARTITIONS": "12",
    "TIMERS_APP_ID": "shop-timers",
    "TIMERS_DATA_DIR": "/var/lib/timers",
    "TIMERS_WEB_HOST": "10.1.2.3",
    "TIMERS_WEB_PORT": "7070",
    "TIMERS_METRICS_PORT": "7071",
    "TIMERS_ADVERTISED_URL": "http://shop-worker-2.shop-worker.shop.svc:7070",
    "TIMERS_LATE_POLICY": "DLQ",
    "TIMERS_MAX_LATENESS_S": "90.5",
    "TIMERS_CLOCK_TOLERANCE_MS": "250",
    "TIMERS_ALLOWED_CALLBACK_TOPICS": " orders.* , ,billing-? ,",
    "TIMERS_MAX_PAYLOAD_BYTES": "4096",
    "TIMERS_MAX_DUE_AHEAD_S": "86400",
    "TIMERS_INGEST_BATCH_SIZE": "500",
    "TIMERS_FIRE_CHUNK_SIZE": "3000",
    "TIMERS_INSTANCE_ID": "timers-worker-2",
    "TIMERS_SESSION_TIMEOUT_S": "10",
    "TIMERS_HEARTBEAT_S": "2.5",
    "TIMERS_REBALANCE_TIMEOUT_S": "30",
}


def test_every_setting_is_read_from_the_environment():
    config = WorkerConfig.from_env(FULL_ENV)
    assert config.app_id == "shop-timers"
    assert config.changelog_topic == "shop-timers-timers-changelog"
    assert config.data_dir == Path("/var/lib/timers")
    assert (config.web_host, config.web_port, config.metrics_port) == ("10.1.2.3", 7070, 7071)
    assert config.canonical_url == "http://shop-worker-2.shop-worker.shop.svc:7070"
    assert config.late_policy is LatePolicy.DLQ
    assert config.max_lateness_s == 90.5
    assert config.clock_tolerance_ms == 250
    assert config.allowed_callback_topics == ("orders.*", "billing-?")
    assert config.max_payload_bytes == 4096
    assert config.max_due_ahead_s == 86400.0
    assert config.ingest_batch_size == 500
    assert config.fire_chunk_size == 3000
    assert config.instance_id == "timers-worker-2"
    assert config.group_timeouts == (10.0, 2.5, 30.0)
    common = config.common
    assert common.kafka.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert common.kafka.profile is BrokerProfile.EMBEDDED
    assert (common.topics.oscillator, common.topics.request) == ("shop-osc", "shop-req")
    assert (common.topics.events, common.topics.dlq, common.topics.partitions) == (
        "shop-events",
        "shop-dlq",
        12,
    )


def test_empty_environment_gives_the_documented_defaults():
    # The data dir is made absolute (Faust would nest a relative one under its own).
    assert WorkerConfig.from_env({}) == WorkerConfig(data_dir=Path("data").resolve())
    # Empty values mean "unset", as a Helm chart renders an empty value.
    blanks = {name: "" for name in FULL_ENV}
    assert WorkerConfig.from_env(blanks) == WorkerConfig(data_dir=Path("data").resolve())


def test_group_timeouts_default_to_the_broker_profile():
    # A dead worker's partitions move within 10 s on a cluster (see docs/FAILOVER.md).
    assert WorkerConfig.from_env({}).group_timeouts == (6.0, 0.5, 20.0)
    embedded = {"TIMERS_BROKER_PROFILE": "embedded"}
    assert WorkerConfig.from_env(embedded).group_timeouts == (6.0, 0.5, 6.0)
    # One setting overrides its own value only.
    shorter = {**embedded, "TIMERS_SESSION_TIMEOUT_S": "3"}
    assert WorkerConfig.from_env(shorter).group_timeouts == (3.0, 0.5, 6.0)


@pytest.mark.parametrize("value", ["fire", "FIRE", "Drop", "dlq"])
def test_late_policy_is_case_insensitive(value):
    assert WorkerConfig.from_env({"TIMERS_LATE_POLICY": value}).late_policy is LatePolicy(value.lower())


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIMERS_APP_ID", "my timers"),
        ("TIMERS_APP_ID", "timers/eu"),
        ("TIMERS_WEB_PORT", "http"),
        ("TIMERS_LATE_POLICY", "later"),
        ("TIMERS_MAX_LATENESS_S", "1h"),
        ("TIMERS_CLOCK_TOLERANCE_MS", "0.5"),
        ("TIMERS_CLOCK_TOLERANCE_MS", "-1"),
        ("TIMERS_MAX_PAYLOAD_BYTES", "1MB"),
        ("TIMERS_MAX_PAYLOAD_BYTES", "0"),
        ("TIMERS_MAX_DUE_AHEAD_S", "a day"),
        ("TIMERS_INGEST_BATCH_SIZE", "0"),
        ("TIMERS_INGEST_BATCH_SIZE", "many"),
        ("TIMERS_FIRE_CHUNK_SIZE", "0"),
        ("TIMERS_FIRE_CHUNK_SIZE", "-5"),
        ("TIMERS_PARTITIONS", "0"),
        ("TIMERS_BROKER_PROFILE", "tansu"),
        ("TIMERS_MAX_DUE_AHEAD_S", "-1"),
        ("TIMERS_WEB_PORT", "70000"),
        ("TIMERS_WEB_PORT", "0"),
        ("TIMERS_INSTANCE_ID", "worker 1"),
        ("TIMERS_SESSION_TIMEOUT_S", "6s"),
        ("TIMERS_HEARTBEAT_S", "0"),
        ("TIMERS_HEARTBEAT_S", "6"),
        ("TIMERS_REBALANCE_TIMEOUT_S", "0"),
    ],
)
def test_invalid_setting_is_a_config_error_naming_it(name, value):
    with pytest.raises(ConfigError, match=name):
        WorkerConfig.from_env({name: value})


def test_static_membership_and_timeouts_reach_the_consumer_group(tmp_path):
    env = {"TIMERS_INSTANCE_ID": "timers-worker-0", "TIMERS_DATA_DIR": str(tmp_path)}
    conf = create_app(WorkerConfig.from_env(env), 4).app.conf
    assert conf.consumer_group_instance_id == "timers-worker-0"
    assert (conf.broker_session_timeout, conf.broker_heartbeat_interval, conf.broker_rebalance_timeout) == (
        6.0,
        0.5,
        20.0,
    )
    # The embedded broker loses static members' groups: the id is not sent there.
    embedded = create_app(WorkerConfig.from_env({**env, "TIMERS_BROKER_PROFILE": "embedded"}), 4).app.conf
    assert embedded.consumer_group_instance_id is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIMERS_METRICS_PORT", "metrics"),
        ("TIMERS_METRICS_PORT", "0"),
        ("TIMERS_METRICS_PORT", "70000"),
        ("TIMERS_METRICS_PORT", "6066"),  # the web port: the admin API would share it again
        ("TIMERS_ADVERTISED_URL", "timers-worker-0:6066"),
        ("TIMERS_ADVERTISED_URL", "http://timers-worker-0"),
        ("TIMERS_ADVERTISED_URL", "http://timers-worker-0:6066/admin"),
        ("TIMERS_ADVERTISED_URL", "ftp://timers-worker-0:6066"),
        ("TIMERS_ADVERTISED_URL", "http://:6066"),
        ("TIMERS_ADVERTISED_URL", "http://timers-worker-0:port"),
    ],
)
def test_bad_web_settings_name_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        WorkerConfig.from_env({name: value})


@settings(max_examples=200)
@given(url=st.text(max_size=80) | st.from_regex(r"\Ahttps?://[a-z0-9.:\[\]-]{0,30}(/[^ ]{0,5})?\Z"))
def test_any_advertised_url_is_taken_or_refused_clearly(url):
    try:
        config = WorkerConfig.from_env({"TIMERS_ADVERTISED_URL": url})
    except ConfigError as exc:
        assert "TIMERS_ADVERTISED_URL" in str(exc)
        return
    assert config.canonical_url == (url.strip() or "http://127.0.0.1:6066")


def test_the_group_learns_the_advertised_url_not_the_bind_address(tmp_path):
    env = {"TIMERS_WEB_HOST": "0.0.0.0", "TIMERS_DATA_DIR": str(tmp_path)}  # noqa: S104 - a pod's
    url = "http://timers-worker-0.timers-worker.delays.svc:6066"
    conf = create_app(WorkerConfig.from_env({**env, "TIMERS_ADVERTISED_URL": url}), 4).app.conf
    assert str(conf.canonical_url) == url
    assert conf.web_bind == "0.0.0.0"  # noqa: S104 - still listens on every interface
    # Unset: the bind address, which is right only where it is an address the others reach.
    plain = create_app(WorkerConfig.from_env({"TIMERS_DATA_DIR": str(tmp_path)}), 4).app.conf
    assert str(plain.canonical_url) == "http://127.0.0.1:6066"


def test_admin_tokens_are_read_from_mounted_files(tmp_path):
    (tmp_path / "token").write_text("admin-token-0123456789\n")
    (tmp_path / "read").write_text("reader-token-0123456789\n")
    env = {
        "TIMERS_ADMIN_TOKEN_FILE": str(tmp_path / "token"),
        "TIMERS_ADMIN_READ_TOKEN_FILE": str(tmp_path / "read"),
        "TIMERS_SCHEMA_REGISTRY_URL": "http://registry:8081",
    }
    (tmp_path / "auth").write_text("user:secret")
    config = WorkerConfig.from_env({**env, "TIMERS_SCHEMA_REGISTRY_BASIC_AUTH_FILE": str(tmp_path / "auth")})
    assert config.admin_token == Secret("admin-token-0123456789")
    assert config.admin_read_token == Secret("reader-token-0123456789")
    assert config.schema_registry is not None
    assert config.schema_registry.basic_auth == Secret("user:secret")
    # The length rule holds for a token from a file as for one from the environment.
    (tmp_path / "token").write_text("short\n")
    with pytest.raises(ConfigError, match="TIMERS_ADMIN_TOKEN is too short"):
        WorkerConfig.from_env(env)


@pytest.mark.parametrize("precise", [False, True])
def test_a_budget_that_cannot_hold_a_firing_of_the_largest_timers_is_refused_saying_what_to_set(precise):
    env = {"TIMERS_FIRE_BUDGET_BYTES": str(1024 * 1024), "TIMERS_PRECISE": "1" if precise else "0"}
    with pytest.raises(ConfigError, match="TIMERS_FIRE_BUDGET_BYTES") as refused:
        WorkerConfig.from_env(env)  # the largest timer by default: 1,000,000 bytes
    least = int(str(refused.value).split("at least ")[1].split(",")[0])
    assert WorkerConfig.from_env({**env, "TIMERS_FIRE_BUDGET_BYTES": str(least)}).fire_budget_bytes == least
    with pytest.raises(ConfigError, match=f"at least {least}"):
        WorkerConfig.from_env({**env, "TIMERS_FIRE_BUDGET_BYTES": str(least - 1)})
    # Smaller timers fit the smallest budget.
    assert WorkerConfig.from_env({**env, "TIMERS_MAX_PAYLOAD_BYTES": "100000"}).max_payload_bytes == 100_000
