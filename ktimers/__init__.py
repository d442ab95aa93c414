"""Shared foundation of kafka-timers: the wire schema, config and Kafka admin.

Everything here depends only on protobuf and confluent-kafka, so the oscillator,
the Faust worker, the client library and the Spark jobs can all import it
without importing each other.
"""
