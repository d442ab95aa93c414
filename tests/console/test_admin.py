"""``timers list`` and ``show`` ask one worker and follow the others it names (``elsewhere``),
so one URL reaches every worker; what a worker answers, however odd, never crashes them."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futures.console.admin import AdminApi, AdminError, Answer, admin_url, elsewhere
from futures.console.pending import list_timers, show_timer
from tests.ingress.fuzzing import FUZZ

Route = Callable[[str, dict[str, str]], tuple[int, Any]]


class Worker:
    """A fake worker's web port: ``route(path, headers)`` → (status, JSON body)."""

    def __init__(self, route: Route) -> None:
        outer = self
        self.route = route
        self.seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.seen.append(self.path)
                status, body = outer.route(self.path, dict(self.headers))
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def workers() -> Iterator[Callable[[Route], Worker]]:
    made: list[Worker] = []

    def make(route: Route) -> Worker:
        made.append(Worker(route))
        return made[-1]

    yield make
    for worker in made:
        worker.close()


def timer(ident: str, due_ms: int, partition: int) -> dict[str, Any]:
    return {"id": ident, "due_ms": due_ms, "partition": partition, "callback_topic": "t", "callback_key": "k"}


def test_a_listing_merges_every_worker_named_and_pages_by_due_time(workers) -> None:
    b_timers = [timer("b1", 1000, 2), timer("b2", 3000, 3)]
    b = workers(
        lambda path, headers: (200, {"timers": b_timers, "next": None, "partitions": [2, 3], "elsewhere": {}})
    )
    a_timers = [timer("a1", 2000, 0), timer("a2", 4000, 1)]
    a_body = {"timers": a_timers, "next": None, "partitions": [0, 1], "elsewhere": {b.url + "/": [2, 3]}}
    a = workers(lambda path, headers: (200, a_body))
    api = AdminApi(a.url, token="tok")
    page = list_timers(api, {"from_ms": 0}, limit=3, partitions=4)
    assert [t["id"] for t in page.timers] == ["b1", "a1", "b2"]
    assert page.next == "3000:b2"  # a fourth timer is left for the next page
    assert page.workers == [a.url, b.url]
    assert page.missing == []
    assert b.seen == ["/api/timers?from_ms=0&limit=3"]


def test_the_first_worker_named_again_under_another_name_counts_once(workers) -> None:
    # --admin reaches a worker through a port-forward; the other worker knows it by its own URL.
    first_url: list[str] = []
    b_body = {"timers": [timer("b1", 1, 1)], "partitions": [1], "elsewhere": {}}
    b = workers(lambda path, headers: (200, {**b_body, "elsewhere": {first_url[0]: [0]}}))
    a_body = {"timers": [timer("a1", 2, 0)], "partitions": [0], "elsewhere": {b.url: [1]}}
    a = workers(lambda path, headers: (200, a_body))
    first_url.append(a.url + "/")  # the same worker, spelt otherwise
    page = list_timers(AdminApi(a.url.replace("127.0.0.1", "localhost")), {}, limit=10, partitions=2)
    assert [t["id"] for t in page.timers] == ["b1", "a1"]
    assert len(page.workers) == 2


def test_a_worker_named_but_gone_is_left_out_and_its_partitions_named(workers) -> None:
    body = {"timers": [], "next": None, "partitions": [0, 1], "elsewhere": {"http://127.0.0.1:1": [2, 3]}}
    a = workers(lambda path, headers: (200, body))
    api = AdminApi(a.url)
    page = list_timers(api, {}, limit=10, partitions=4)
    assert page.missing == [2, 3]
    assert list(api.unreachable) == ["http://127.0.0.1:1"]


def test_show_asks_the_workers_named_until_one_holds_the_timer(workers) -> None:
    b = workers(lambda path, headers: (200, {"id": "x y/z", "due_ms": 5}))
    a = workers(lambda path, headers: (404, {"error": "not here", "elsewhere": {b.url: [1]}}))
    shown = show_timer(AdminApi(a.url), "x y/z", payload=True)
    assert shown == {"id": "x y/z", "due_ms": 5, "worker": b.url}
    assert b.seen == ["/api/timers/x%20y%2Fz?payload=1"]


def test_show_of_a_timer_no_worker_holds_is_none(workers) -> None:
    a = workers(lambda path, headers: (404, {"error": "not here", "elsewhere": {}}))
    assert show_timer(AdminApi(a.url), "gone", payload=False) is None


def test_the_token_is_sent_and_a_refusal_says_what_to_set(workers) -> None:
    def route(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        ok = headers.get("Authorization") == "Bearer good-token"
        return (200, {"timers": [], "partitions": [0]}) if ok else (401, {"error": "missing or wrong token"})

    a = workers(route)
    assert list_timers(AdminApi(a.url, token="good-token"), {}, 10, 1).missing == []
    with pytest.raises(AdminError, match="reading timers takes a token: set TIMERS_ADMIN_READ_TOKEN"):
        list_timers(AdminApi(a.url), {}, 10, 1)
    with pytest.raises(AdminError, match="the token sent is not one of its tokens"):
        list_timers(AdminApi(a.url, token="bad"), {}, 10, 1)


def test_a_port_that_is_no_worker_says_so(workers) -> None:
    a = workers(lambda path, headers: (200, ["not", "an", "object"]))
    with pytest.raises(AdminError, match="no JSON object: is it a worker's web port"):
        list_timers(AdminApi(a.url), {}, 10, 1)


@pytest.mark.parametrize("url", ["ftp://host", "127.0.0.1:6066", "http://", ""])
def test_an_admin_url_that_is_no_http_url_is_refused(url) -> None:
    with pytest.raises(AdminError, match="give a worker's web URL, like http://127.0.0.1:6066"):
        admin_url(url or " ", {})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
BODIES = st.fixed_dictionaries(
    {},
    optional={
        "timers": st.lists(
            st.fixed_dictionaries({}, optional={"id": JSON, "due_ms": JSON, "partition": JSON}) | JSON,
            max_size=5,
        ),
        "next": JSON,
        "partitions": JSON | st.lists(st.integers(-2, 5)),
        "elsewhere": JSON | st.dictionaries(st.text(max_size=10), JSON | st.lists(st.integers())),
        "held_by": JSON,
    },
)


class CannedApi(AdminApi):
    """Answers every request with the next body; no network."""

    def __init__(self, bodies: list[tuple[int, dict[str, Any]]]) -> None:
        super().__init__("http://first")
        self.bodies = bodies

    def get(self, url: str, path: str, query: Any = None) -> Answer:
        status, body = self.bodies.pop(0) if self.bodies else (404, {})
        return Answer(url, status, body)


@settings(FUZZ, max_examples=150)
@given(
    st.lists(st.tuples(st.sampled_from([200, 200, 404, 400, 401, 403]), BODIES), min_size=1, max_size=4),
    st.sampled_from([{}, {"partition": 1}]),
)
def test_any_answer_gives_a_page_or_an_admin_error(bodies, query) -> None:
    try:
        page = list_timers(CannedApi(list(bodies)), query, limit=2, partitions=4)
    except AdminError:
        return
    assert len(page.timers) <= 2
    json.dumps(page.timers)
    try:
        show_timer(CannedApi(list(bodies)), "x", payload=False)
    except AdminError:
        pass
    assert isinstance(elsewhere(bodies[0][1]), dict)
