"""The worker's Schema Registry: where it is, and the client the ingress check asks (optional).

Only the worker talks to a registry (the ingress parsers and the Spark jobs import
no Kafka client); the check itself is :class:`futures.ingress.registry.SchemaCheck`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from futures.ingress.registry import SchemaSource
from ktimers.config import NO_DEFAULT, Env, EnvVar, Secret, env_float, env_secret
from ktimers.errors import ConfigError

#: What :meth:`SchemaRegistryConfig.from_env` reads.
REGISTRY_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "TIMERS_SCHEMA_REGISTRY_URL",
        f"{NO_DEFAULT} (trust the message index)",
        "check framed requests' schema ids against this Schema Registry",
    ),
    EnvVar("TIMERS_SCHEMA_REGISTRY_BASIC_AUTH", NO_DEFAULT, "user:password for the registry (never logged)"),
    EnvVar(
        "TIMERS_SCHEMA_REGISTRY_BASIC_AUTH_FILE",
        NO_DEFAULT,
        "file holding user:password, instead of the above",
    ),
    EnvVar("TIMERS_SCHEMA_REGISTRY_TIMEOUT_S", "2", "longest wait for one registry lookup, seconds"),
)


@dataclass(frozen=True)
class SchemaRegistryConfig:
    """Where the Schema Registry is. Environment: ``TIMERS_SCHEMA_REGISTRY_*``."""

    url: str
    basic_auth: Secret | None = None
    timeout_s: float = 2.0

    @classmethod
    def from_env(cls, env: Env | None = None) -> SchemaRegistryConfig | None:
        """The registry to check against, or None when ``TIMERS_SCHEMA_REGISTRY_URL`` is unset."""
        env = os.environ if env is None else env
        auth = env_secret(env, "TIMERS_SCHEMA_REGISTRY_BASIC_AUTH")
        timeout_s = env_float(env, "TIMERS_SCHEMA_REGISTRY_TIMEOUT_S", cls.timeout_s)
        url = env.get("TIMERS_SCHEMA_REGISTRY_URL", "").strip()
        if not url:
            return None
        config = cls(url=url, basic_auth=Secret(auth) if auth else None, timeout_s=timeout_s)
        config.validate()
        return config

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"TIMERS_SCHEMA_REGISTRY_URL={self.url!r}: give an http:// or https:// URL")
        if not 0 < self.timeout_s <= 30:
            raise ConfigError("TIMERS_SCHEMA_REGISTRY_TIMEOUT_S must be above 0 and at most 30 seconds")
        if self.basic_auth is not None and ":" not in self.basic_auth.get_secret_value():
            raise ConfigError("TIMERS_SCHEMA_REGISTRY_BASIC_AUTH must be user:password")
        try:
            import confluent_kafka.schema_registry  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                f"TIMERS_SCHEMA_REGISTRY_URL needs the Schema Registry client ({exc}): "
                "pip install 'kafka-timers[registry]'"
            ) from exc

    def client(self) -> SchemaSource:
        """A confluent-kafka registry client that never retries and waits at most the timeout."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf: dict[str, Any] = {"url": self.url, "timeout": self.timeout_s, "max.retries": 0}
        if self.basic_auth is not None:
            conf["basic.auth.user.info"] = self.basic_auth.get_secret_value()
        source: SchemaSource = SchemaRegistryClient.new_client(conf)
        return source
