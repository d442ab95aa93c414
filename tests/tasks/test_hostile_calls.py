"""Hostile task records: whatever a record holds, the task worker decodes it or dead-letters it, never raises.

A record that made the task worker raise would be read again after the
restart, and raise again: one record would stop every task after it. So, for
values of any bytes, JSON of any shape and numbers of any size, and headers of
any kind: :func:`decode` returns a call or raises :class:`UndecodableCall` with
a short message; :meth:`TaskRunner.handle` returns an outcome; and the dead
letter it writes always fits the producer's limit, with header keys it can encode.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from futures.ingress.records import SourceRecord
from futures.tasks import RetryPolicy, TaskConfig, TaskError, TaskRegistry
from futures.tasks.codec import MAX_DEPTH, TASK_NAME, TaskCall, UndecodableCall, decode
from futures.tasks.errors import UnschedulableRetry
from futures.tasks.runner import MAX_ID_BYTES, DeadLetter, Outcome, TaskRunner, retry_id
from futures.tasks.worker import MAX_RECORD_BYTES, dead_letter_record
from ktimers.deadletter import H_ORIGINAL_SIZE, H_TRUNCATED, MAX_DETAIL_CHARS, headers_size
from ktimers.wire import H_ERROR, H_ID, H_REASON, header_value

#: The longest UndecodableCall message (characters): fixed text around short() details.
MAX_MESSAGE = 1000
REASONS = {"undecodable", "unknown-task", "task-failed"}

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,  # no .hypothesis/ in the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- strategies: JSON text, written by hand so it can hold what json.dumps never writes --

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=30)  # lone surrogates included
EXTREME_NUMBERS = st.one_of(
    st.integers().map(str),
    st.integers(min_value=4290, max_value=4310).map(lambda n: "9" * n),  # around int's 4300-digit limit
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0", "2e308", "1.5"]),
    st.floats().map(lambda f: json.dumps(f)),  # nan, inf as Python writes them
)
JSON_STRINGS = st.one_of(
    ANY_TEXT.map(json.dumps),  # a lone surrogate becomes a "\udXXX" escape
    st.sampled_from(['"\\ud800"', '"x\\udfff"', '"\\u0000"', '"send-reminder"', '""']),
)
SCALARS = st.one_of(st.sampled_from(["null", "true", "false"]), EXTREME_NUMBERS, JSON_STRINGS)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(JSON_STRINGS, inner), max_size=4).map(
            lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"
        ),
    ),
    max_leaves=12,
)
DEEP = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)


def mostly(usual: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """``usual`` three draws in four: hostile fields must not crowd out the calls that get far."""
    return st.one_of(usual, usual, usual, odd)


@st.composite
def call_texts(draw: st.DrawFn) -> str:
    """A JSON object shaped like a call, each field valid, odd, or missing."""
    fields = {
        '"v"': mostly(st.just("1"), JSON_VALUES),
        '"task"': mostly(
            st.sampled_from(['"send"', '"not-registered"']), st.one_of(JSON_STRINGS, JSON_VALUES)
        ),
        '"args"': mostly(
            st.lists(SCALARS, max_size=3).map(lambda a: "[" + ",".join(a) + "]"), JSON_VALUES | DEEP
        ),
        '"kwargs"': mostly(st.just('{"k":1}'), JSON_VALUES),
        '"attempt"': mostly(st.just("0"), EXTREME_NUMBERS | JSON_VALUES),
    }
    parts = [f"{name}:{draw(value)}" for name, value in fields.items() if draw(st.integers(0, 9))]
    return "{" + ",".join(parts) + "}"


# Calls as apply_later writes them, with any JSON data as arguments.
PY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
VALID_CALLS = st.builds(
    TaskCall,
    st.sampled_from(["send", "not-registered"]),
    st.lists(PY_JSON, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=5), PY_JSON, max_size=3),
    st.integers(0, 3),
).map(TaskCall.encode)

RECORD_VALUES = st.one_of(
    VALID_CALLS,
    st.none(),
    st.binary(max_size=300),
    call_texts().map(lambda text: text.encode("utf-8", "surrogatepass")),  # raw surrogates: not UTF-8
    call_texts().map(str.encode),
    JSON_VALUES.map(str.encode),
    DEEP.map(str.encode),
)
# Header names as a consumer hands them over: text, ours, and names that were not
# UTF-8 on the wire (decoded with surrogateescape, as futures/worker/fetch.py does).
HEADER_KEYS = st.one_of(
    st.sampled_from(["kt-id", "kt-token", "kt-due-ms", "kt-reason"]),
    st.text(max_size=30),
    st.binary(max_size=30).map(lambda raw: raw.decode("utf-8", "surrogateescape")),
)
HEADERS = st.lists(st.tuples(HEADER_KEYS, st.one_of(st.none(), st.binary(max_size=40))), max_size=6)


# -- decode ------------------------------------------------------------------


def check_decoded(value: bytes | None) -> TaskCall | None:
    """The property of decode: a call that round-trips, or a short UndecodableCall; never anything else."""
    try:
        call = decode(value)
    except UndecodableCall as exc:
        assert 0 < len(str(exc)) <= MAX_MESSAGE
        return None
    assert TASK_NAME.fullmatch(call.task)
    assert isinstance(call.args, tuple) and isinstance(call.kwargs, dict)
    assert isinstance(call.attempt, int) and call.attempt >= 0
    assert decode(call.encode()) == call  # its retry can be written
    return call


@FUZZ
@given(RECORD_VALUES)
def test_any_value_decodes_to_a_call_or_a_short_rejection(value):
    check_decoded(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b'{"v":1,"task":"t","args":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper"),
        (b'{"v":1,"task":"t","args":' + b"[" * 70 + b"]" * 70 + b"}", "deeper than 64 levels"),
        (b'{"v":1,"task":"t","args":[' + b"9" * 5000 + b"]}", "4300 digits"),
        (b'{"v":1,"task":"t","args":[NaN]}', "NaN is not JSON"),
        (b'{"v":1,"task":"t","kwargs":{"x":-Infinity}}', "-Infinity is not JSON"),
        (b'{"v":1,"task":"t","args":[1e999]}', "Out of range float"),
        (b'{"v":1,"task":"t","args":["\\ud800"]}', "surrogates not allowed"),
        (b'{"v":1,"task":"t","kwargs":{"\\udfff":1}}', "surrogates not allowed"),
        (b'{"v":1,"task":"t\xed\xa0\x80"}', "not UTF-8"),  # an encoded surrogate
        ('{"v":1,"task":"t"}'.encode("utf-16"), "not UTF-8"),  # JSON, but not UTF-8
        (b'\xef\xbb\xbf{"v":1,"task":"t"}', "BOM"),
        (b'{"v":1,"task":"t","attempt":' + b"9" * 4000 + b"}", '"attempt" must be an integer'),
        (b'{"v":1,"task":"t","attempt":true}', '"attempt"'),
        (b'{"v":1,"task":"t","attempt":1.0}', '"attempt"'),
        (b'{"v":1,"task":"rm -rf /"}', '"task" must be a task name'),
        (b'{"v":1,"task":"' + b"x" * 201 + b'"}', '"task" must be a task name'),
        (b'{"v":1,"task":7}', '"task" must be a task name'),
        (b'{"v":1,"task":"t","args":"abc"}', '"args" must be a list'),
        (b'{"v":1,"task":"t","kwargs":[]}', '"args" must be a list'),
        (b'{"v":"' + b"9" * 900_000 + b'","task":"t"}', "unknown task call version"),
        (b"", "not JSON"),
    ],
)
def test_each_kind_of_hostile_value_is_rejected_with_a_short_reason(value, message):
    with pytest.raises(UndecodableCall, match=message) as caught:
        decode(value)
    assert len(str(caught.value)) <= MAX_MESSAGE


def test_what_the_worker_would_refuse_is_refused_when_scheduling():
    nested: list = []
    for _ in range(MAX_DEPTH):
        nested = [nested]
    for args in [(nested,), ("\ud800",), (float("inf"),)]:
        with pytest.raises(TaskError, match="must be JSON data"):
            TaskCall("t", args).encode()


def test_what_decode_accepts_apply_later_could_have_written():
    deepest_allowed = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)  # inside the args list
    call = decode(f'{{"v":1,"task":"t","args":[{deepest_allowed}, {"9" * 4300}, -0.0, "é"]}}'.encode())
    assert call.args[1] == int("9" * 4300) and call.args[3] == "é"
    assert decode(call.encode()) == call


# -- the runner --------------------------------------------------------------


class Harness:
    def __init__(self) -> None:
        self.registry = TaskRegistry(TaskConfig(retry=RetryPolicy(max_retries=1)))
        self.ran: list[tuple] = []
        self.retries: list[tuple[TaskCall, float, str]] = []
        self.dead: list[DeadLetter] = []
        self.registry.register("send")(lambda *args, **kwargs: self.ran.append((args, kwargs)))
        self.runner = TaskRunner(self.registry, lambda *a: self.retries.append(a), self.dead.append)

    def record(self, value: bytes | None, headers=(), offset: int = 0) -> SourceRecord:
        return SourceRecord("timer-tasks", 0, offset, b"key", value, tuple(headers))


@FUZZ
@given(RECORD_VALUES, HEADERS)
def test_any_record_runs_or_is_dead_lettered_and_its_dead_letter_can_be_written(value, headers):
    h = Harness()
    outcome = h.runner.handle(h.record(value, headers))
    assert isinstance(outcome, Outcome)
    call = check_decoded(value)
    if outcome is Outcome.RAN:
        assert call is not None and call.task == "send" and len(h.ran) == 1
    for letter in h.dead:
        assert letter.reason in REASONS
        assert len(letter.error) <= MAX_DETAIL_CHARS
        check_writable(letter)


def check_writable(letter: DeadLetter, max_bytes: int = MAX_RECORD_BYTES) -> list:
    key, value, headers = dead_letter_record(letter, max_bytes)
    for name, header in headers:
        name.encode("utf-8")  # strict: librdkafka cannot send (confluent-kafka crashes on) anything else
        assert header is None or isinstance(header, bytes)
    assert len(key or b"") + len(value or b"") + headers_size(headers) <= max_bytes
    return headers


@FUZZ
@given(
    st.integers(0, 1_200_000),
    st.integers(0, 5000),
    st.lists(st.tuples(HEADER_KEYS, st.integers(0, 300_000)), max_size=5),
)
def test_a_dead_letter_always_fits_the_producer_whatever_the_size_of_the_record(
    value_size, key_size, header_sizes
):
    headers = [(name, b"h" * size) for name, size in header_sizes]
    record = SourceRecord("timer-tasks", 3, 17, b"k" * key_size, b"v" * value_size, tuple(headers))
    letter = DeadLetter(record, "undecodable", "not JSON: " + "x" * 5000)
    out = check_writable(letter)
    assert header_value(out, H_REASON) == b"undecodable"
    original = (
        key_size + value_size + sum(len(k.encode("utf-8", "surrogatepass")) + len(v) for k, v in headers)
    )
    if header_value(out, H_TRUNCATED) is not None:
        assert header_value(out, H_ORIGINAL_SIZE) == str(original).encode()


def test_a_near_1mb_record_is_dead_lettered_cut_down_with_its_original_size():
    value = b'{"v":1,"task":"nope","args":["' + b"x" * 999_900 + b'"]}'
    record = SourceRecord("timer-tasks", 0, 5, b"key", value, ((H_ID, b"t-1"), ("kt-due-ms", b"1")))
    h = Harness()
    assert h.runner.handle(record) is Outcome.DEAD
    [letter] = h.dead
    key, cut, headers = dead_letter_record(letter, MAX_RECORD_BYTES)
    assert header_value(headers, H_REASON) == b"unknown-task"
    assert b"value" in (header_value(headers, H_TRUNCATED) or b"").split(b",")
    assert int(header_value(headers, H_ORIGINAL_SIZE) or 0) > len(value)
    assert cut is not None and value.startswith(cut) and len(cut) > 990_000
    assert header_value(headers, H_ID) == b"t-1"  # small headers survive the cut
    # A record that fits is copied as it was, without the marks.
    small = dead_letter_record(DeadLetter(h.record(b"{}"), "undecodable", "x"), MAX_RECORD_BYTES)
    assert small[1] == b"{}" and header_value(small[2], H_TRUNCATED) is None


def test_a_flood_of_hostile_records_is_counted_but_logged_a_few_times(caplog):
    h = Harness()
    with caplog.at_level(logging.WARNING, logger="futures.tasks.runner"):
        for offset in range(1000):
            assert h.runner.handle(h.record(b"[" * 5000, offset=offset)) is Outcome.DEAD
    assert h.runner.dead_counts["undecodable"] == len(h.dead) == 1000
    lines = [r for r in caplog.records if r.name == "futures.tasks.runner"]
    assert 1 <= len(lines) <= 20
    assert "nested deeper" in lines[0].getMessage()


def test_a_failing_task_whose_retry_cannot_be_written_is_dead_lettered():
    registry = TaskRegistry(TaskConfig(retry=RetryPolicy(max_retries=3)))
    registry.register("fails")(lambda: 1 / 0)
    dead: list[DeadLetter] = []

    def refuse(*_args):
        raise UnschedulableRetry("the call is too large for a retry timer")

    runner = TaskRunner(registry, refuse, dead.append)
    record = SourceRecord("timer-tasks", 0, 1, None, TaskCall("fails").encode(), ((H_ID, b"t-1"),))
    assert runner.handle(record) is Outcome.DEAD
    assert dead[0].reason == "task-failed"
    assert "ZeroDivisionError" in dead[0].error and "too large for a retry timer" in dead[0].error


def test_retry_ids_stay_within_the_timer_services_id_limit():
    assert retry_id("job-1", 1) == "job-1.retry-1"
    long_id = "é" * 400  # 800 bytes
    assert retry_id(long_id, 2) == retry_id(long_id, 2)  # derived: a repeated callback replaces it
    assert len(retry_id(long_id, 2).encode()) <= MAX_ID_BYTES
    assert retry_id(long_id, 2).endswith(".retry-2") and retry_id(long_id, 2) != retry_id("é" * 401, 2)


def test_a_huge_timer_id_is_still_recognised_when_its_callback_repeats():
    h = Harness()
    record = h.record(TaskCall("send").encode(), [(H_ID, b"x" * 500_000)])
    assert [h.runner.handle(record), h.runner.handle(record)] == [Outcome.RAN, Outcome.REPEAT]


def test_an_undecodable_record_without_headers_is_dead_lettered_with_its_reason():
    h = Harness()
    assert h.runner.handle(h.record(None)) is Outcome.DEAD
    headers = check_writable(h.dead[0])
    assert header_value(headers, H_ERROR) == b"null value: expected a JSON task call"
