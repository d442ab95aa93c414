"""Configuration of the jobs: the service's shared config, plus the worker's app id."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from futures.ingress.limits import DEFAULT_APP_ID, ParseLimits
from ktimers.config import CommonConfig, Env, EnvVar

#: What :meth:`JobConfig.from_env` reads besides ``COMMON_ENV`` (docs/configuration.md).
JOB_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "TIMERS_APP_ID",
        "timers",
        "the worker's app id: --truncate never deletes requests its consumer group has not committed",
    ),
)


@dataclass(frozen=True)
class JobConfig:
    """Built once in ``main()`` from ``KAFKA_*`` and ``TIMERS_*`` (the workers' environment)."""

    common: CommonConfig = field(default_factory=CommonConfig)
    #: The worker's ``TIMERS_APP_ID``: its consumer group (``--truncate`` never
    #: deletes what it has not consumed) and the prefix of its internal topics.
    app_id: str = DEFAULT_APP_ID

    @classmethod
    def from_env(cls, env: Env | None = None) -> JobConfig:
        env = os.environ if env is None else env
        return cls(common=CommonConfig.from_env(env), app_id=env.get("TIMERS_APP_ID") or cls.app_id)

    def parse_limits(self) -> ParseLimits:
        """What requests are parsed with: the service's topics, none of the worker's limits.

        See :mod:`futures.jobs.decode` for why the limits are left to `timer-events`.
        """
        return ParseLimits.permissive(self.common.topics, self.app_id)
