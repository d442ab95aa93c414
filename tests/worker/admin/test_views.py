"""The admin views without a broker: the OpenAPI spec names exactly the served routes; auth rules."""

from __future__ import annotations

from typing import Any, cast

import faust
import pytest

from futures.worker.admin import openapi
from futures.worker.admin.params import ApiError
from futures.worker.admin.views import AdminApi, register_admin
from futures.worker.config import WorkerConfig
from futures.worker.status import WorkerStatus
from ktimers.config import Secret


def test_the_spec_documents_every_api_route_and_only_those() -> None:
    app = faust.App("admin-spec-test", broker="kafka://127.0.0.1:1")
    register_admin(app, WorkerConfig(), cast(Any, None), WorkerStatus(), cast(Any, None))
    served = {
        path: {m.lower() for m in view.get_methods()} - {"head"}
        for path, view in app.web.views.items()
        if path.startswith("/api/")
    }
    documented = {path: set(ops) for path, ops in openapi.spec(4)["paths"].items()}
    assert served == documented


def api(token: str | None) -> AdminApi:
    config = WorkerConfig(admin_token=Secret(token) if token else None)
    return AdminApi(cast(Any, None), config, cast(Any, None), WorkerStatus(), cast(Any, None))


def test_without_a_configured_token_mutations_are_disabled_and_say_how_to_enable() -> None:
    with pytest.raises(ApiError) as caught:
        api(None).authorize("Bearer anything-at-all-0123456789")
    assert caught.value.status == 403 and "TIMERS_ADMIN_TOKEN" in caught.value.message


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Basic c2VjcmV0", "Bearer wrong", "bearer s3cret-token-123456x"]
)
def test_a_missing_or_wrong_token_is_401(header: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        api("s3cret-token-123456").authorize(header)
    assert caught.value.status == 401


def test_the_right_token_passes() -> None:
    api("s3cret-token-123456").authorize("Bearer s3cret-token-123456")
    api("s3cret-token-123456").authorize("bearer  s3cret-token-123456")


def test_short_tokens_are_refused_at_start() -> None:
    with pytest.raises(Exception, match="too short"):
        WorkerConfig.from_env({"TIMERS_ADMIN_TOKEN": "short"})
    with pytest.raises(Exception, match="TIMERS_ADMIN_READ_TOKEN is too short"):
        WorkerConfig.from_env({"TIMERS_ADMIN_READ_TOKEN": "short"})
    assert WorkerConfig.from_env({}).admin_token is None
    assert "123" not in repr(WorkerConfig.from_env({"TIMERS_ADMIN_TOKEN": "0123456789abcdef0123"}))
    assert "123" not in repr(WorkerConfig.from_env({"TIMERS_ADMIN_READ_TOKEN": "0123456789abcdef0123"}))


def test_a_read_token_equal_to_the_admin_token_is_refused_at_start() -> None:
    same = "0123456789abcdef0123"
    with pytest.raises(Exception, match="could cancel"):
        WorkerConfig.from_env({"TIMERS_ADMIN_TOKEN": same, "TIMERS_ADMIN_READ_TOKEN": same})


def test_timer_reads_are_closed_unless_opened_explicitly() -> None:
    assert WorkerConfig.from_env({}).admin_open_reads is False
    assert WorkerConfig.from_env({"TIMERS_ADMIN_OPEN_READS": "1"}).admin_open_reads is True
    with pytest.raises(Exception, match="TIMERS_ADMIN_OPEN_READS"):
        WorkerConfig.from_env({"TIMERS_ADMIN_OPEN_READS": "maybe"})
