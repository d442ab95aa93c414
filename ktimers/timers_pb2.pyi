from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Future(_message.Message):
    __slots__ = ("callBackTopic", "callBackKey", "callBack", "id", "due_ms", "token", "headers", "recurrence")
    CALLBACKTOPIC_FIELD_NUMBER: _ClassVar[int]
    CALLBACKKEY_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DUE_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    RECURRENCE_FIELD_NUMBER: _ClassVar[int]
    callBackTopic: str
    callBackKey: str
    callBack: bytes
    id: str
    due_ms: int
    token: str
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    recurrence: Recurrence
    def __init__(self, callBackTopic: _Optional[str] = ..., callBackKey: _Optional[str] = ..., callBack: _Optional[bytes] = ..., id: _Optional[str] = ..., due_ms: _Optional[int] = ..., token: _Optional[str] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., recurrence: _Optional[_Union[Recurrence, _Mapping]] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class FutureBatch(_message.Message):
    __slots__ = ("futures",)
    FUTURES_FIELD_NUMBER: _ClassVar[int]
    futures: _containers.RepeatedCompositeFieldContainer[Future]
    def __init__(self, futures: _Optional[_Iterable[_Union[Future, _Mapping]]] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class Tick(_message.Message):
    __slots__ = ("second", "source", "emitted_ms")
    SECOND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EMITTED_MS_FIELD_NUMBER: _ClassVar[int]
    second: int
    source: str
    emitted_ms: int
    def __init__(self, second: _Optional[int] = ..., source: _Optional[str] = ..., emitted_ms: _Optional[int] = ...) -> None: ...

class StoredTimer(_message.Message):
    __slots__ = ("future", "source_partition", "source_offset", "accepted_ms", "source_topic")
    FUTURE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    future: Future
    source_partition: int
    source_offset: int
    accepted_ms: int
    source_topic: str
    def __init__(self, future: _Optional[_Union[Future, _Mapping]] = ..., source_partition: _Optional[int] = ..., source_offset: _Optional[int] = ..., accepted_ms: _Optional[int] = ..., source_topic: _Optional[str] = ...) -> None: ...

class TimerEvent(_message.Message):
    __slots__ = ("id", "kind", "due_ms", "at_ms", "partition", "source_offset", "reason", "callback_topic")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[TimerEvent.Kind]
        SCHEDULED: _ClassVar[TimerEvent.Kind]
        FIRED: _ClassVar[TimerEvent.Kind]
        CANCELLED: _ClassVar[TimerEvent.Kind]
        CANCEL_MISSED: _ClassVar[TimerEvent.Kind]
        REJECTED: _ClassVar[TimerEvent.Kind]
    KIND_UNSPECIFIED: TimerEvent.Kind
    SCHEDULED: TimerEvent.Kind
    FIRED: TimerEvent.Kind
    CANCELLED: TimerEvent.Kind
    CANCEL_MISSED: TimerEvent.Kind
    REJECTED: TimerEvent.Kind
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DUE_MS_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_TOPIC_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: TimerEvent.Kind
    due_ms: int
    at_ms: int
    partition: int
    source_offset: int
    reason: str
    callback_topic: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[TimerEvent.Kind, str]] = ..., due_ms: _Optional[int] = ..., at_ms: _Optional[int] = ..., partition: _Optional[int] = ..., source_offset: _Optional[int] = ..., reason: _Optional[str] = ..., callback_topic: _Optional[str] = ...) -> None: ...

class TimerEventBatch(_message.Message):
    __slots__ = ("events", "fired", "scheduled")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TimerEvent]
    fired: _containers.RepeatedCompositeFieldContainer[FiredTimers]
    scheduled: _containers.RepeatedCompositeFieldContainer[ScheduledTimers]
    def __init__(self, events: _Optional[_Iterable[_Union[TimerEvent, _Mapping]]] = ..., fired: _Optional[_Iterable[_Union[FiredTimers, _Mapping]]] = ..., scheduled: _Optional[_Iterable[_Union[ScheduledTimers, _Mapping]]] = ...) -> None: ...

class FiredTimers(_message.Message):
    __slots__ = ("id", "due_ms", "source_offset", "at_ms", "partition")
    ID_FIELD_NUMBER: _ClassVar[int]
    DUE_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    id: _containers.RepeatedScalarFieldContainer[str]
    due_ms: _containers.RepeatedScalarFieldContainer[int]
    source_offset: _containers.RepeatedScalarFieldContainer[int]
    at_ms: int
    partition: int
    def __init__(self, id: _Optional[_Iterable[str]] = ..., due_ms: _Optional[_Iterable[int]] = ..., source_offset: _Optional[_Iterable[int]] = ..., at_ms: _Optional[int] = ..., partition: _Optional[int] = ...) -> None: ...

class Recurrence(_message.Message):
    __slots__ = ("cron", "time_zone", "interval_ms", "until_ms", "max_count", "ordinal", "first_due_ms")
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    FIRST_DUE_MS_FIELD_NUMBER: _ClassVar[int]
    cron: str
    time_zone: str
    interval_ms: int
    until_ms: int
    max_count: int
    ordinal: int
    first_due_ms: int
    def __init__(self, cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., interval_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., max_count: _Optional[int] = ..., ordinal: _Optional[int] = ..., first_due_ms: _Optional[int] = ...) -> None: ...

class ScheduledTimers(_message.Message):
    __slots__ = ("id", "due_ms", "source_offset", "callback_topic", "at_ms", "partition", "at_event")
    ID_FIELD_NUMBER: _ClassVar[int]
    DUE_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_TOPIC_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    AT_EVENT_FIELD_NUMBER: _ClassVar[int]
    id: _containers.RepeatedScalarFieldContainer[str]
    due_ms: _containers.RepeatedScalarFieldContainer[int]
    source_offset: _containers.RepeatedScalarFieldContainer[int]
    callback_topic: _containers.RepeatedScalarFieldContainer[str]
    at_ms: int
    partition: int
    at_event: int
    def __init__(self, id: _Optional[_Iterable[str]] = ..., due_ms: _Optional[_Iterable[int]] = ..., source_offset: _Optional[_Iterable[int]] = ..., callback_topic: _Optional[_Iterable[str]] = ..., at_ms: _Optional[int] = ..., partition: _Optional[int] = ..., at_event: _Optional[int] = ...) -> None: ...
