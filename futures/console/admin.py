"""The workers' admin API (docs/admin.md) as the command line uses it: over HTTP, from one
worker's URL to all of them.

Each worker answers for the partitions it holds and names the worker holding each of the
others (``elsewhere``: URL → partitions); :meth:`AdminApi.each` starts from the URL given
and follows those names, so one URL reaches the whole group. Timers themselves need a token:
``TIMERS_ADMIN_READ_TOKEN`` (reads only), else ``TIMERS_ADMIN_TOKEN``, the variables the
workers take theirs from. Every failure is an :class:`AdminError` whose message says what to do.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ktimers.config import DEFAULT_APP_ID, NO_DEFAULT, EnvVar
from ktimers.errors import TimersError

Json = dict[str, Any]

ADMIN_URL_ENV = "TIMERS_ADMIN_URL"
DEFAULT_ADMIN_URL = "http://127.0.0.1:6066"
#: The token variables, in the order they are tried: the least power first.
TOKEN_ENVS = ("TIMERS_ADMIN_READ_TOKEN", "TIMERS_ADMIN_TOKEN")
#: Seconds one request to a worker may take.
TIMEOUT_S = 5.0
#: Answers larger than this are not the admin API's (bytes).
MAX_ANSWER_BYTES = 32 * 1024 * 1024

ADMIN_ENV = (
    EnvVar(
        ADMIN_URL_ENV,
        DEFAULT_ADMIN_URL,
        "a worker's web URL (--admin): asked first, then the workers it names",
    ),
    EnvVar(TOKEN_ENVS[0], NO_DEFAULT, "a read token of the workers, sent to read timers (list, show)"),
    EnvVar(TOKEN_ENVS[1], NO_DEFAULT, "the workers' admin token, sent instead when no read token is set"),
    EnvVar("TIMERS_APP_ID", DEFAULT_APP_ID, "the workers' app id: status reads its consumer group's lag"),
)


class AdminError(TimersError):
    """The admin API could not answer; the message says what to fix."""


@dataclass(frozen=True)
class Answer:
    url: str
    status: int
    body: Json


def admin_url(given: str | None, env: Mapping[str, str]) -> str:
    """The worker URL to start from: ``--admin``, else ``TIMERS_ADMIN_URL``, else the default."""
    url = (given or env.get(ADMIN_URL_ENV, "") or DEFAULT_ADMIN_URL).strip().rstrip("/")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        source = "--admin" if given else ADMIN_URL_ENV
        raise AdminError(f"{source}={url!r}: give a worker's web URL, like {DEFAULT_ADMIN_URL}")
    return url


def token_from(env: Mapping[str, str]) -> str | None:
    for name in TOKEN_ENVS:
        token = env.get(name, "").strip()
        if token:
            return token
    return None


@dataclass
class AdminApi:
    """Asks workers' admin APIs, starting at ``url``."""

    url: str
    token: str | None = None
    timeout_s: float = TIMEOUT_S
    #: Workers named by others that did not answer: URL → why.
    unreachable: dict[str, str] = field(default_factory=dict)

    def get(self, url: str, path: str, query: Mapping[str, object] | None = None) -> Answer:
        """``GET url+path?query``; its JSON answer whatever the status. :class:`AdminError` when
        the worker cannot be reached or does not answer JSON."""
        target = url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(target, headers={"Accept": "application/json"})  # noqa: S310 - http(s) only
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                status, raw = response.status, response.read(MAX_ANSWER_BYTES)
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read(MAX_ANSWER_BYTES)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(
                f"cannot reach the admin API at {url} ({reason}): check --admin or {ADMIN_URL_ENV}, "
                "and that a worker serves there (TIMERS_WEB_HOST, TIMERS_WEB_PORT)"
            ) from exc
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise AdminError(
                f"{url} answered {path} with status {status} but no JSON object: is it a worker's web port?"
            )
        return Answer(url, status, body)

    def read(
        self, url: str, path: str, query: Mapping[str, object] | None = None, found: tuple[int, ...] = (200,)
    ) -> Answer:
        """:meth:`get`, with a refusal (a status outside ``found``) raised as :class:`AdminError`."""
        answer = self.get(url, path, query)
        if answer.status in found:
            return answer
        error = str(answer.body.get("error", answer.body))
        if answer.status == 401:
            variables = "TIMERS_ADMIN_READ_TOKEN (or TIMERS_ADMIN_TOKEN)"
            fix = (
                f"the token sent is not one of its tokens: set {variables} to a token the workers have"
                if self.token is not None
                else f"reading timers takes a token: set {variables} in this shell"
            )
            raise AdminError(f"{url} refused: {fix}")
        raise AdminError(f"{url} refused ({answer.status}): {error}")

    def each(
        self,
        path: str,
        held: Callable[[Json], set[int]],
        query: Mapping[str, object] | None = None,
    ) -> Iterator[Answer]:
        """The answer of every worker, starting at :attr:`url` and following ``elsewhere``.

        The first worker must answer; one named by another that cannot be reached is left
        out and kept in :attr:`unreachable` (it may be restarting: a rebalance will say).
        ``held(body)``: the partitions an answer is for. An answer only for partitions
        already answered for is left out: the first worker again, under the name the others
        know it by (``--admin`` through a port-forward, say), whose timers would count twice.
        """
        seen = {self.url}
        queue = [self.url]
        covered: set[int] = set()
        while queue:
            url = queue.pop(0)
            try:
                answer = self.read(url, path, query)
            except AdminError as exc:
                if url == self.url:
                    raise
                self.unreachable[url] = str(exc)
                continue
            partitions = held(answer.body)
            if url != self.url and partitions and partitions <= covered:
                continue
            covered |= partitions
            yield answer
            for other in sorted(elsewhere(answer.body)):
                if other not in seen:
                    seen.add(other)
                    queue.append(other)


def elsewhere(body: Json) -> dict[str, list[int]]:
    """The ``elsewhere`` map of an answer (worker URL → partitions); {} when it has none."""
    named = body.get("elsewhere")
    if not isinstance(named, dict):
        return {}
    return {
        str(url).rstrip("/"): [p for p in parts if isinstance(p, int)]
        for url, parts in named.items()
        if isinstance(parts, list)
    }
