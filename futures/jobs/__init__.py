"""PySpark batch jobs over the request log: ``compact``, ``replay`` and ``report``.

Each job module has ``extract`` (read Kafka or a snapshot), a pure ``transform``
on DataFrames, ``load`` (write Parquet or Kafka) and ``main()``, the only place a
SparkSession is built. Kafka is read and written by the Spark tasks with
confluent-kafka (:mod:`futures.jobs.kafka_source`; the logs are decoded where they
are read, :mod:`futures.jobs.logs`), so the jobs run on a cluster as they do in
``local[*]``. The jobs never import the
worker: they share the wire format, the request parser and the config.
"""
