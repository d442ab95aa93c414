"""The oscillator's settings, built once from the environment.

Environment (on top of the shared ``KAFKA_*`` and ``TIMERS_TOPIC_*``):

* ``TIMERS_OSC_INSTANCE``: id written into every tick's ``source`` (default ``<hostname>-<pid>``).
* ``TIMERS_OSC_HEALTH_HOST`` / ``TIMERS_OSC_HEALTH_PORT``: where ``/healthz``, ``/readyz`` and ``/metrics``
  listen (default ``127.0.0.1:8090``).
* ``TIMERS_OSC_STALE_AFTER_S``: ``/readyz`` fails when no tick was delivered for this many
  seconds (default 5).
* ``TIMERS_OSC_METADATA_REFRESH_S``: how often the partition count is re-read, seconds (default 30).
* ``TIMERS_LOG_LEVEL``: ``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR`` (default ``INFO``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from ktimers.config import CommonConfig, Env, EnvVar, default_of, env_float, env_int, env_log_level
from ktimers.errors import ConfigError


def default_instance() -> str:
    """``<hostname>-<pid>``: unique among the instances running at once."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class OscillatorConfig:
    common: CommonConfig = field(default_factory=CommonConfig)
    instance: str = field(default_factory=default_instance)
    health_host: str = "127.0.0.1"
    health_port: int = 8090
    stale_after_s: float = 5.0
    metadata_refresh_s: float = 30.0
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Env | None = None) -> OscillatorConfig:
        env = os.environ if env is None else env
        port = env_int(env, "TIMERS_OSC_HEALTH_PORT", cls.health_port)
        if not 1 <= port <= 65535:
            raise ConfigError(f"TIMERS_OSC_HEALTH_PORT={port}: use a TCP port between 1 and 65535")
        stale_after_s = env_float(env, "TIMERS_OSC_STALE_AFTER_S", cls.stale_after_s)
        # Ticks go out once a second, so anything at or under 1 s reports a healthy
        # oscillator as stale between two ticks.
        if stale_after_s <= 1.0:
            raise ConfigError(f"TIMERS_OSC_STALE_AFTER_S={stale_after_s}: must be more than 1 second")
        refresh_s = env_float(env, "TIMERS_OSC_METADATA_REFRESH_S", cls.metadata_refresh_s)
        if refresh_s <= 0:
            raise ConfigError(f"TIMERS_OSC_METADATA_REFRESH_S={refresh_s}: must be positive")
        log_level = env_log_level(env, cls.log_level)
        return cls(
            common=CommonConfig.from_env(env),
            instance=env.get("TIMERS_OSC_INSTANCE") or default_instance(),
            health_host=env.get("TIMERS_OSC_HEALTH_HOST") or cls.health_host,
            health_port=port,
            stale_after_s=stale_after_s,
            metadata_refresh_s=refresh_s,
            log_level=log_level,
        )


#: What :meth:`OscillatorConfig.from_env` reads besides ``SHARED_ENV`` (docs/configuration.md); the
#: defaults are the dataclass's.
OSCILLATOR_ENV: tuple[EnvVar, ...] = (
    # The default is computed at start (default_instance).
    EnvVar("TIMERS_OSC_INSTANCE", "<host>-<pid>", "id written into every tick's source"),
    EnvVar(
        "TIMERS_OSC_HEALTH_HOST",
        default_of(OscillatorConfig, "health_host"),
        "address of /healthz, /readyz and /metrics",
    ),
    EnvVar(
        "TIMERS_OSC_HEALTH_PORT",
        default_of(OscillatorConfig, "health_port"),
        "port of /healthz, /readyz and /metrics; each oscillator on one host needs its own",
    ),
    EnvVar(
        "TIMERS_OSC_STALE_AFTER_S",
        default_of(OscillatorConfig, "stale_after_s"),
        "/readyz fails when no tick was delivered for this many seconds (more than 1)",
    ),
    EnvVar(
        "TIMERS_OSC_METADATA_REFRESH_S",
        default_of(OscillatorConfig, "metadata_refresh_s"),
        "how often the partition count is re-read, seconds",
    ),
)
