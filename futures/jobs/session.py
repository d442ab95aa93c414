"""The SparkSession of a job: built once, in ``main()``, from :class:`SparkSettings`."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from futures.jobs.errors import JobError
from futures.jobs.kafka_source import KafkaDataSource

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"

JAVA_HINT = (
    "PySpark 4 needs Java 17 or later: run `make java` (installs openjdk-17-jre-headless with apt) "
    "or point JAVA_HOME at a JDK 17+"
)


def under_spark_submit() -> bool:
    """True when spark-submit launched us: it started the JVM and chose the master."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def resolve_master(requested: str | None) -> str | None:
    """``--master`` if given; else spark-submit's choice; else :data:`DEFAULT_MASTER`."""
    if requested:
        return requested
    return None if under_spark_submit() else DEFAULT_MASTER


#: Shuffled data a task takes in local mode (compressed): as many request rows as one sort holds
#: in memory (docs/PERFORMANCE.md#the-spark-jobs).
LOCAL_TASK_SHUFFLE_BYTES = "16m"

# Spark's adaptive execution merges shuffle partitions into as few tasks as keep every core busy
# (parallelismFirst). In local mode, where all tasks share one JVM's memory (1 GiB by default),
# that made a compaction's tasks few and large, and their sorts spill to disk; tasks of a fixed
# size keep each sort in memory however large the log, and their number grows with it.
_LOCAL_TASK_SIZE = {
    "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
    "spark.sql.adaptive.advisoryPartitionSizeInBytes": LOCAL_TASK_SHUFFLE_BYTES,
}


# A batch job wants throughput from its collector: G1's write barriers and concurrent refinement
# take a share of a compaction's CPU (docs/PERFORMANCE.md#the-spark-jobs), and its
# short pauses buy nothing here. Only for local masters, whose one JVM this process starts; a
# cluster's executors are configured by whoever runs it (spark.executor.extraJavaOptions).
_LOCAL_JVM = {"spark.driver.extraJavaOptions": "-XX:+UseParallelGC"}

#: Snapshots are written partitioned by due date. Spark's planned write sorts each task's rows by the
#: partition column before writing; with concurrent writers a task keeps one file open per due date
#: it meets (up to this many, then it sorts the rest) and writes the rows in the order they come.
CONCURRENT_WRITERS = 32
_UNSORTED_WRITES = {
    "spark.sql.optimizer.plannedWrite.enabled": "false",
    "spark.sql.maxConcurrentOutputFileWriters": str(CONCURRENT_WRITERS),
}


@dataclass(frozen=True)
class SparkSettings:
    master: str | None = DEFAULT_MASTER  # None: spark-submit's
    app_name: str = "kafka-timers"
    #: Spark's console progress bar (stages and tasks done).
    progress: bool = True
    ui: bool = False
    shuffle_partitions: int | None = None
    conf: Mapping[str, str] = field(default_factory=dict)


def build_session(settings: SparkSettings) -> SparkSession:
    """A SparkSession with the Kafka data source registered, UTC time, and the venv's Python."""
    local = settings.master is not None and settings.master.startswith("local")
    if local:
        # Spark's Python workers must be this virtualenv's interpreter: the system
        # Python lacks pyarrow, confluent-kafka and this project.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(settings.app_name)
    if settings.master is not None:
        builder = builder.master(settings.master)
    conf = {
        # Due dates (snapshot partitions, report buckets) are UTC days, wherever the job runs.
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(settings.ui).lower(),
        "spark.ui.showConsoleProgress": str(settings.progress).lower(),
        **({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"} if local else {}),
        **(_LOCAL_TASK_SIZE if local else {}),
        **(_LOCAL_JVM if local else {}),
        **_UNSORTED_WRITES,
        **(
            {"spark.sql.shuffle.partitions": str(settings.shuffle_partitions)}
            if settings.shuffle_partitions
            else {}
        ),
        **settings.conf,
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # PySparkRuntimeError JAVA_GATEWAY_EXITED, FileNotFoundError for `java`
        if "JAVA_GATEWAY_EXITED" in str(exc) or "java" in str(exc).lower():
            raise JobError(f"cannot start Spark ({exc.__class__.__name__}). {JAVA_HINT}") from exc
        raise
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(KafkaDataSource)
    return spark
