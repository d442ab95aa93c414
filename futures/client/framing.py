"""Timer requests in the Confluent Schema Registry wire format, for topics that enforce schemas.

A framed value is a prefix (magic byte 0, the schema id, the message index) and
then the message as it is sent bare. The prefix of each request type is the one
confluent-kafka's ``ProtobufSerializer`` writes for it (registering
proto/timers.proto under the request topic's subject, ``timer-request-value``,
unless its configuration says otherwise), asked once; every record after that is
framed without the registry. Needs the ``registry`` extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from futures.client.records import TimerRecord
from ktimers.errors import ConfigError, DeliveryError
from ktimers.wire import KIND_HEADER, REQUEST_MESSAGES


class RequestFraming:
    """Frames the records of one request topic; ``registry`` is a ``SchemaRegistryClient`` or its URL.

    ``serializer_config`` is ``ProtobufSerializer``'s (e.g. ``{"auto.register.schemas": False,
    "use.latest.version": True}`` where schemas are registered by a pipeline).
    """

    def __init__(self, registry: Any, topic: str, serializer_config: Mapping[str, Any] | None = None) -> None:
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as exc:
            raise ConfigError(
                f"schema_registry= needs the Schema Registry client ({exc}): "
                "pip install 'kafka-timers[registry]'"
            ) from exc
        if isinstance(registry, str):
            registry = SchemaRegistryClient.new_client({"url": registry})
        self._registry = registry
        self._topic = topic
        self._config = dict(serializer_config or {})
        self._prefixes: dict[bytes, bytes] = {}

    @property
    def ready(self) -> bool:
        """Whether every prefix is known, so that framing needs no registry."""
        return len(self._prefixes) == len(REQUEST_MESSAGES)

    def prepare(self) -> None:
        """Ask the registry for each request type's schema id (registering it if so configured); blocks."""
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        context = SerializationContext(self._topic, MessageField.VALUE)
        for kind, message_type in REQUEST_MESSAGES.items():
            if kind in self._prefixes:
                continue
            try:
                serializer = ProtobufSerializer(message_type, self._registry, self._config)
                # An empty message serializes to no bytes: what is left is the framing.
                prefix = serializer(message_type(), context)
            except Exception as exc:
                raise DeliveryError(
                    f"the Schema Registry gave no schema id for {message_type.__name__} on {self._topic!r}: "
                    f"{exc}"
                ) from exc
            assert prefix  # noqa: S101 - a serializer always writes the framing
            self._prefixes[kind] = prefix

    def frame(self, record: TimerRecord) -> TimerRecord:
        """``record`` with its value framed (asking the registry first if :attr:`ready` is false)."""
        if not self.ready:
            self.prepare()
        kind = next(value for name, value in record.headers if name == KIND_HEADER)
        assert isinstance(kind, bytes)  # noqa: S101 - the record builders write it so
        return replace(record, value=self._prefixes[kind] + record.value)
