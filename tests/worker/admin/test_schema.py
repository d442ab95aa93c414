"""The admin API fuzzed from its own OpenAPI document (schemathesis), against the live server.

The worker's views are served by Faust's aiohttp driver on 127.0.0.1, as in a worker;
behind them a real engine (tests/worker/rig.py) on RocksDB tables under ``tmp_path``.
The document is fetched from the server itself, and each operation is sent values it
admits (positive) and values it refuses (negative), with the admin token, a wrong one or
none. Every answer must be a documented status with a body matching its schema — never a
5xx — and every cancel or reschedule the API accepts (202) is handed to the engine, which
must apply it: no dead letter, no rejection, and a series stays a series.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futures.worker.admin import openapi
from ktimers.config import TopicsConfig
from tests.worker.admin.live import ADMIN, KNOWN, LiveApi

schemathesis = pytest.importorskip("schemathesis")
GenerationMode = schemathesis.GenerationMode

#: Examples per operation and generation mode: enough to reach every parameter's edges,
#: few enough that the whole module takes seconds.
EXAMPLES = 40
#: Answers by operation and status, printed at the end (``pytest -s``).
ANSWERS: Counter[tuple[str, int]] = Counter()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    api = LiveApi(tmp_path_factory.mktemp("schema"))
    yield api
    api.close()
    operations = {operation for operation, _ in ANSWERS}
    print(f"\nschemathesis: {ANSWERS.total()} requests over {len(operations)} operations")
    for (operation, status), count in sorted(ANSWERS.items()):
        print(f"  {operation:45} {status} x{count}")


@pytest.fixture(scope="module")
def schema(live: LiveApi) -> Any:
    return schemathesis.openapi.from_url(f"{live.base_url}/api/openapi.json")


def _operations() -> list[str]:
    paths = openapi.spec(TopicsConfig().partitions)["paths"]
    return [f"{method.upper()} {path}" for path, ops in paths.items() for method in ops]


@pytest.mark.parametrize("operation", _operations())
def test_every_admitted_input_gets_a_documented_answer_and_no_5xx(
    live: LiveApi, schema: Any, operation: str
) -> None:
    method, path = operation.split(" ", 1)
    api_operation = schema[path][method]
    # Made-up ids, and the known timers, which a made-up id almost never hits.
    fixed: list[dict[str, str] | None] = [None]
    if "{timer_id}" in path:
        fixed += [{"timer_id": timer_id} for timer_id in KNOWN]
    cases = st.one_of(
        [api_operation.as_strategy(mode, path_parameters=ids) for mode in GenerationMode for ids in fixed]
    )
    tokens = st.sampled_from([ADMIN, ADMIN, ADMIN, None, "wrong-token-0123456789"])

    @given(case=cases, token=tokens)
    @settings(
        max_examples=EXAMPLES * len(fixed) * len(GenerationMode),
        derandomize=True,
        database=None,
        deadline=None,
    )
    def fuzz(case: Any, token: str | None) -> None:
        live.restore()
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        response = case.call(base_url=live.base_url, headers=headers)
        ANSWERS[operation, response.status_code] += 1
        case.validate_response(response, headers=headers)
        if response.status_code == 202:
            live.apply_sent()

    fuzz()
