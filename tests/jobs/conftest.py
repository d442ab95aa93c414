"""Fixtures for the Spark jobs: one local[2] SparkSession for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from futures.jobs.session import SparkSettings, build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        SparkSettings(
            master="local[2]",
            app_name="kafka-timers-tests",
            progress=False,
            ui=False,
            shuffle_partitions=2,
            conf={"spark.default.parallelism": "2"},
        )
    )
    yield session
    session.stop()
