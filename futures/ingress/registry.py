"""Checking a framed record's schema id against a Confluent Schema Registry (optional).

Pure logic over a registry client it is given (the worker builds one from
``TIMERS_SCHEMA_REGISTRY_URL``: :mod:`futures.worker.schemas`). With it, a framed
request (:mod:`futures.ingress.framing`) is parsed only if the registry knows its
schema id and the message its index names there is *compatible* with
proto/timers.proto's message of that index:

* the schema is a protobuf schema, and the message the index names has the same
  name as ours (``Future``, ``FutureBatch`` or ``Cancel``; the package may differ);
* every field number we read that the registered message also declares has the
  same type and the same cardinality (repeated or not) there; a message-typed
  field names a message of the same schema that is compatible in turn (a
  ``Future``'s ``headers``, a ``FutureBatch``'s ``futures``).

Fields we do not read are ignored, and a field we read that the registered message
lacks is simply never set: bytes written with such a schema decode correctly with
ours, which is all the worker needs.

The parse path is synchronous, on the worker's event loop, so a lookup is bounded
and rare: each schema id is asked once (ids are immutable in a registry: a verdict
on an id is final) with a bounded timeout and no retries; an id the registry does
not know is asked again at most every :data:`UNKNOWN_RETRY_S`; a registry that did
not answer is not asked again for :data:`UNAVAILABLE_FOR_S`, and records needing a
lookup meanwhile are dead-lettered ``schema-registry-unavailable`` at once. So
the event loop waits for the registry at most one timeout per
:data:`UNAVAILABLE_FOR_S`, and never for an id it has judged.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from futures.ingress.framing import Framed
from ktimers import timers_pb2
from ktimers.wire import REQUEST_MESSAGES

log = logging.getLogger(__name__)

#: Seconds before an id the registry did not know is asked about again (it may be registered since).
UNKNOWN_RETRY_S = 60.0
#: Seconds a registry that did not answer (timeout, connection refused, 5xx, 401) is left alone.
UNAVAILABLE_FOR_S = 10.0
#: Schema ids whose verdict is kept; beyond it the oldest is forgotten (and asked again if seen).
MAX_REMEMBERED_IDS = 10_000


class SchemaSource(Protocol):
    """What is asked of a registry client (confluent-kafka's ``SchemaRegistryClient``)."""

    def get_schema(
        self,
        schema_id: int,
        subject_name: str | None = None,
        fmt: str | None = None,
        reference_format: str | None = None,
    ) -> Any: ...


_Schema = descriptor_pb2.FileDescriptorProto


@dataclass(frozen=True)
class _Refusal:
    """The registry's answer for an id whose schema cannot be used: (reason, detail), and whether
    asking again later may change it (an id not registered yet)."""

    problem: tuple[str, str]
    may_change: bool


@dataclass(frozen=True)
class _Verdict:
    problem: tuple[str, str] | None  # (reason, detail), None: compatible
    until: float  # monotonic seconds; inf: final


class SchemaCheck:
    """Whether a framed request's schema is one the worker may read; answers cached per schema id.

    One instance lives as long as the worker's parse limits, so what it learnt
    outlives a batch. Not thread-safe: the worker parses on one event loop.
    """

    def __init__(self, source: SchemaSource, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._clock = clock
        self._verdicts: dict[tuple[int, bytes], _Verdict] = {}
        self._schemas: dict[int, descriptor_pb2.FileDescriptorProto] = {}
        self._unavailable_until = -1.0
        self._unavailable_detail = ""

    def problem(self, framed: Framed) -> tuple[str, str] | None:
        """Why ``framed`` may not be parsed, as (reason, detail), or None; ``framed.kind`` must be set."""
        kind = framed.kind
        assert kind is not None  # noqa: S101 - the caller rejects unknown indexes first
        key = (framed.schema_id, kind)
        now = self._clock()
        verdict = self._verdicts.get(key)
        if verdict is not None and verdict.until > now:
            return verdict.problem
        if now < self._unavailable_until:
            return "schema-registry-unavailable", self._unavailable_detail
        schema = self._lookup(framed.schema_id, now)
        if schema is None:
            return "schema-registry-unavailable", self._unavailable_detail
        if isinstance(schema, _Refusal):
            # An id's schema never changes: only an id not registered yet may be one later.
            verdict = _Verdict(schema.problem, now + UNKNOWN_RETRY_S if schema.may_change else float("inf"))
        else:
            message = REQUEST_MESSAGES[kind].DESCRIPTOR.name
            verdict = _Verdict(_incompatibility(schema, framed, message), float("inf"))
        if len(self._verdicts) >= MAX_REMEMBERED_IDS:
            del self._verdicts[next(iter(self._verdicts))]
        self._verdicts[key] = verdict
        return verdict.problem

    def _lookup(self, schema_id: int, now: float) -> _Schema | _Refusal | None:
        """The registered schema, a rejection for an id the registry refuses, or None: it did not answer."""
        known = self._schemas.get(schema_id)
        if known is not None:
            return known
        try:
            # "serialized": a protobuf schema as its FileDescriptorProto, not as .proto text.
            schema = self._source.get_schema(schema_id, fmt="serialized")
        except Exception as exc:
            # 404 with a registry error code (40403 "Schema not found"): the registry answered.
            # A 404 from something that is no registry (a wrong URL) is not an answer.
            status, code = getattr(exc, "http_status_code", None), getattr(exc, "error_code", None)
            if status == 404 and isinstance(code, int) and 40400 <= code < 40500:
                problem = ("schema-rejected", f"schema id {schema_id} is not in the Schema Registry")
                return _Refusal(problem, may_change=True)
            self._unavailable_until = now + UNAVAILABLE_FOR_S
            self._unavailable_detail = (
                f"the Schema Registry did not answer for schema id {schema_id} ({type(exc).__name__}: "
                f"{str(exc)[:160]}); asked again in {UNAVAILABLE_FOR_S:g} s"
            )
            log.warning("%s", self._unavailable_detail)
            return None
        parsed = _descriptor(schema_id, schema)
        if isinstance(parsed, tuple):
            return _Refusal(parsed, may_change=False)
        if len(self._schemas) >= MAX_REMEMBERED_IDS:
            del self._schemas[next(iter(self._schemas))]
        self._schemas[schema_id] = parsed
        return parsed


def _descriptor(schema_id: int, schema: Any) -> descriptor_pb2.FileDescriptorProto | tuple[str, str]:
    schema_type = getattr(schema, "schema_type", None) or "AVRO"  # the registry's default type
    if schema_type != "PROTOBUF":
        return "schema-rejected", f"schema id {schema_id} is a {schema_type} schema, not a protobuf one"
    try:
        raw = base64.b64decode(schema.schema_str or "", validate=True)
        return descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return (
            "schema-rejected",
            f"schema id {schema_id} did not come back as a serialized descriptor "
            "(the registry must answer ?format=serialized: Confluent Schema Registry 5.5 or later)",
        )


_OURS = descriptor_pb2.FileDescriptorProto()
timers_pb2.DESCRIPTOR.CopyToProto(_OURS)


def _incompatibility(
    theirs: descriptor_pb2.FileDescriptorProto, framed: Framed, name: str
) -> tuple[str, str] | None:
    """Why the registered message ``framed`` names cannot be read as our ``name``, or None."""
    [index] = framed.indexes  # every timer request is a top-level message
    messages = theirs.message_type
    if not 0 <= index < len(messages):
        return (
            "schema-rejected",
            f"schema id {framed.schema_id} has {len(messages)} top-level messages: no message {index}",
        )
    problem = _differences(_message(_OURS, name), messages[index], theirs, set())
    if problem is None:
        return None
    return "schema-rejected", f"schema id {framed.schema_id}: {problem}, so proto/timers.proto cannot read it"


def _message(file: descriptor_pb2.FileDescriptorProto, name: str) -> descriptor_pb2.DescriptorProto:
    return next(m for m in file.message_type if m.name == name)


def _differences(
    ours: descriptor_pb2.DescriptorProto,
    theirs: descriptor_pb2.DescriptorProto,
    file: descriptor_pb2.FileDescriptorProto,
    seen: set[str],
) -> str | None:
    """How ``theirs`` differs from ``ours`` in what we read, or None; ``seen`` breaks cycles."""
    if theirs.name != ours.name:
        return f"the message index names {theirs.name!r}, not {ours.name!r}"
    if ours.name in seen:
        return None
    seen.add(ours.name)
    fields = {f.number: f for f in theirs.field}
    for field in ours.field:
        other = fields.get(field.number)
        if other is None:
            continue
        where = f"{ours.name}.{field.name} (field {field.number})"
        if other.type != field.type or _repeated(other) != _repeated(field):
            return f"{where} is {_shown(other)} there, {_shown(field)} here"
        if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
            nested = _named(file, other.type_name)
            if nested is None:
                return f"{where} names {other.type_name}, which the schema does not define itself"
            problem = _differences(_message(_OURS, field.type_name.rsplit(".", 1)[-1]), nested, file, seen)
            if problem is not None:
                return problem
    return None


def _named(file: descriptor_pb2.FileDescriptorProto, type_name: str) -> descriptor_pb2.DescriptorProto | None:
    """A top-level message of ``file`` by its fully qualified name (``.package.Name``)."""
    prefix = f".{file.package}." if file.package else "."
    return next((m for m in file.message_type if prefix + m.name == type_name), None)


def _repeated(field: descriptor_pb2.FieldDescriptorProto) -> bool:
    return field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED


def _shown(field: descriptor_pb2.FieldDescriptorProto) -> str:
    kind = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type).removeprefix("TYPE_").lower()
    return f"repeated {kind}" if _repeated(field) else kind
