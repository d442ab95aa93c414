"""The Faust app's broker credentials: TLS trusts what the worker's librdkafka clients trust."""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi
import faust
import pytest

from futures.worker.app import _credentials
from ktimers.config import KafkaConfig
from ktimers.errors import ConfigError

CHART_TLS = {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "probe"}


def tls_context(env: dict[str, str]) -> ssl.SSLContext:
    credentials = _credentials(KafkaConfig.from_env(env))
    context = getattr(credentials, "context", None) or getattr(credentials, "ssl_context", None)
    assert isinstance(context, ssl.SSLContext)
    return context


def test_probe_means_the_system_ca_store_as_the_chart_sets_it_without_a_ca_secret() -> None:
    context = tls_context(CHART_TLS)

    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.cert_store_stats() == ssl.create_default_context().cert_store_stats()


def test_sasl_over_tls_with_probe_carries_the_system_store_too() -> None:
    env = {
        **CHART_TLS,
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "timers",
        "KAFKA_SASL_PASSWORD": "not-a-real-password",
    }
    credentials = _credentials(KafkaConfig.from_env(env))

    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.ssl_context is not None
    assert credentials.ssl_context.verify_mode is ssl.CERT_REQUIRED


def test_any_other_location_is_a_ca_bundle_file() -> None:
    context = tls_context({**CHART_TLS, "KAFKA_SSL_CA_LOCATION": certifi.where()})

    assert len(context.get_ca_certs()) > 10  # the bundle's certificates, loaded from the file


def test_a_ca_file_that_is_not_there_is_a_config_error_naming_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "ca.crt"

    with pytest.raises(ConfigError, match=rf"KAFKA_SSL_CA_LOCATION='{missing}'.*probe"):
        _credentials(KafkaConfig.from_env({**CHART_TLS, "KAFKA_SSL_CA_LOCATION": str(missing)}))


def test_plaintext_has_no_credentials() -> None:
    assert _credentials(KafkaConfig.from_env({})) is None
