"""What the vLLM and SGLang clients share: one HTTP call with its failures mapped.

The only network code of the engine clients. Every transport failure (refused
connection, reset, timeout) becomes ``RetryableEngineError`` (a timeout the subclass
``EngineTimeoutError``, which a caller may choose not to retry); a 5xx (or 429) answer
too, unless the caller asks to read it (SGLang's dp_size 500 is permanent); the
engine-specific modules decide what each 4xx means. Error bodies come nested
(``{"error": {"message", ...}}``, current vLLM), flat (``{"message", ...}``, older
vLLM and SGLang's OpenAI routes), as SGLang's ``{"error_message"}``, as plain text or
as a proxy's HTML page: ``error_text`` reads them all (a page by its ``<title>``, any
message cut to ``MAX_MESSAGE_CHARS``). ``/v1/models`` and ``/health`` look alike on both
engines, so they live here.

``timeout_s`` bounds a whole call, its body included: httpx's own timeout bounds each
read, so a pod that trickles its answer a byte at a time would otherwise hold a call
(and the tick waiting on it) for ever. A wait for a free connection in the client's own
pool (``httpx.PoolTimeout``, after half of ``timeout_s``) is no sign of a hung pod, which
was never asked: a plain ``RetryableEngineError``, retried where a timeout is not. A
body past ``MAX_BODY_BYTES`` (decoded) is refused, not read into memory; one that cannot
be decoded (a ``Content-Encoding`` it does not have) is a ``RetryableEngineError`` like
any other bad transfer.

A 5xx or 429 with a ``Retry-After`` names it in the message and carries the wait it
asks for as ``RetryableEngineError.retry_after_s`` (``retry_after_s`` reads it, RFC 9110:
delta-seconds or an HTTP-date, against ``wall_clock``); a value it cannot read is named
and not honoured. How much of the wait a retry honours is the retrier's to cap (the
executor: ``ExecutorSettings.backoff_max_s``), not the client's.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC
from email.utils import parsedate_to_datetime
from types import MappingProxyType
from typing import Any

import httpx

from placement.domain import AdapterId, PodId
from placement.errors import EngineTimeoutError, PermanentEngineError, RetryableEngineError
from placement.ports import Registered
from placement.settings import ENGINE_KEEPALIVE_S

DEFAULT_TIMEOUT_S = 30.0
#: The most of a pod's answer read (decoded): a ``/v1/models`` of thousands of adapters
#: or a ``/metrics`` page is a few MiB.
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Error messages are cut there: a message that is a whole page or a traceback says no
#: more for being longer.
MAX_MESSAGE_CHARS = 1000
#: A ``Retry-After`` asking for more than a day is a mistake (milliseconds given for
#: seconds, a date in the wrong year), not a wait: it is named but not honoured.
MAX_RETRY_AFTER_S = 86_400.0
#: RFC 9110 delta-seconds: ASCII digits only (no sign, no fraction); past 12 of them it
#: is over MAX_RETRY_AFTER_S anyway, and int() is not asked to read a thousand.
_DELTA_SECONDS = re.compile(r"[0-9]{1,12}")
#: The day names an HTTP-date opens with before its comma (IMF-fixdate, RFC 850), in
#: English whatever the locale.
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAYS = frozenset((*_DAYS, *(day[:3] for day in _DAYS)))
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def engine_http_client(
    *, max_connections: int = 100, keepalive_s: float = ENGINE_KEEPALIVE_S
) -> httpx.AsyncClient:
    """An HTTP client for engine calls, to share across pods: every connection it opens
    may be kept, and an idle one is dropped before the pod's keep-alive ends."""
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=keepalive_s,
    )
    return httpx.AsyncClient(limits=limits)


def _short(text: str, *, limit: int = MAX_MESSAGE_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters in all)"


def _plain(response: httpx.Response, *, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A body that is not JSON: a proxy's HTML page by its title, else its text."""
    text = response.text.strip()
    if text.startswith("<"):
        title = _TITLE.search(text[:65536])
        if title is not None and title.group(1).strip():
            words = _short(" ".join(title.group(1).split()), limit=limit)
            return f"{words} (an HTML page: a proxy in front of the pod?)"
    return _short(text, limit=limit)


_JSON_KINDS = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def _json_kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), "number")


def error_text(response: httpx.Response) -> str:
    """The human message of an error body, whichever shape the engine used."""
    try:
        body = response.json()
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError; too deep
        return _plain(response)
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict) and isinstance(nested.get("message"), str):
            return _short(str(nested["message"]))
        for key in ("error_message", "message", "detail"):
            if isinstance(body.get(key), str):
                return _short(str(body[key]))
    if isinstance(body, str):
        return _short(body)
    return _short(response.text.strip())


#: The most of a body ``body_excerpt`` keeps: a log line's worth.
EXCERPT_CHARS = 200
#: C0 and C1 control characters and DEL: a pod's body must not end or colour a log line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def body_excerpt(status: int, body: bytes, *, limit: int = EXCERPT_CHARS) -> str:
    """A short, one-line excerpt of an answer's body, for an error or a log line: its
    message as ``error_text`` reads it (a proxy's HTML page by its title), control
    characters and runs of white space as one space, cut to ``limit`` characters;
    ``(empty body)`` when nothing is left."""
    message = error_text(httpx.Response(status, content=body))
    words = " ".join(_CONTROL.sub(" ", message).split())
    if not words:
        return "(empty body)"
    if len(words) <= limit:
        return words
    return f"{words[:limit]}... ({len(body)} bytes in all)"


def is_route_missing(response: httpx.Response) -> bool:
    """FastAPI's own 404 for a route that is not mounted: ``{"detail":"Not Found"}``."""
    if response.status_code != 404:
        return False
    try:
        return bool(response.json() == {"detail": "Not Found"})
    except (ValueError, RecursionError):
        return False


class HttpEngine:
    """Base of the engine clients: one pod, one (possibly shared) ``httpx.AsyncClient``.

    URLs are absolute, so one client with one connection pool (or one test transport)
    can serve a whole fleet; a client made here is owned and closed by ``aclose``.
    """

    def __init__(
        self,
        pod: PodId,
        url: str,
        *,
        served_model_name: str | None = None,
        http: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``wall_clock``: epoch seconds to read a ``Retry-After`` date against; the real
        wall clock, never a warped one, since the pod's date is wall time."""
        self._pod = pod
        self._url = url.rstrip("/")
        self._served_model_name = served_model_name
        self._owns_http = http is None
        self._http = http if http is not None else engine_http_client()
        self._timeout_s = timeout_s
        # The pool wait gets half the call's budget: at the whole budget the call's own
        # deadline (``call``) would fire first and read a full pool as a hung pod.
        self._timeout = httpx.Timeout(timeout_s, pool=timeout_s / 2)
        self._wall_clock = wall_clock

    @property
    def pod(self) -> PodId:
        return self._pod

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    def retryable(self, message: str, *, status: int | None = None) -> RetryableEngineError:
        return RetryableEngineError(message, pod=self._pod, status=status)

    def timed_out(self, method: str, path: str) -> EngineTimeoutError:
        return EngineTimeoutError(
            f"{method} {path} timed out after {self._timeout_s:g} s", pod=self._pod
        )

    def retryable_answer(self, message: str, response: httpx.Response) -> RetryableEngineError:
        """A 5xx or 429 worth retrying: ``message`` plus the ``Retry-After`` it named,
        whose wait (when it can be read) the error carries as ``retry_after_s``."""
        # Every value the header came with (sent twice, httpx's get would join them).
        afters = response.headers.get_list("retry-after")
        if not any(afters):
            return self.retryable(message, status=response.status_code)
        return RetryableEngineError(
            f"{message} (Retry-After: {_short(', '.join(afters))})",
            pod=self._pod,
            status=response.status_code,
            retry_after_s=retry_after_s(afters, now_s=self._wall_clock()),
        )

    def permanent(self, message: str, *, status: int | None = None) -> PermanentEngineError:
        return PermanentEngineError(message, pod=self._pod, status=status)

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        answer_5xx: bool = False,
    ) -> httpx.Response:
        """Send one request and read its whole answer within ``timeout_s``; transport
        failures, and 5xx/429 unless ``answer_5xx`` (the caller reads them itself), raise
        RetryableEngineError."""
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._send(method, path, body)
        except TimeoutError:
            raise self.timed_out(method, path) from None
        if not answer_5xx and (response.status_code >= 500 or response.status_code == 429):
            raise self.retryable_answer(
                f"{method} {path} answered {response.status_code}: {error_text(response)}",
                response,
            )
        return response

    async def _send(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        try:
            request = self._http.build_request(
                method, self._url + path, json=body, timeout=self._timeout
            )
            streamed = await self._http.send(request, stream=True)
            try:
                content = await self._read_capped(method, path, streamed)
            finally:
                await streamed.aclose()
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise self.permanent(f"bad pod url {self._url!r}: {exc}") from None
        except httpx.PoolTimeout:
            # No connection free in the client's own pool (a fleet over its limit): the
            # pod was never asked, so this is no sign of a hung pod; worth a retry.
            raise self.retryable(
                f"{method} {path} waited {self._timeout.pool:g} s for a free connection "
                "in the client's pool"
            ) from None
        except httpx.TimeoutException:
            raise self.timed_out(method, path) from None
        except httpx.HTTPError as exc:
            detail = str(exc) or "the connection broke"  # a reset mid-answer says nothing
            raise self.retryable(
                f"{method} {path} failed: {type(exc).__name__}: {detail}"
            ) from None
        # The body is decoded now: the answer keeps its headers but its encoding and length.
        headers = [
            (k, v)
            for k, v in streamed.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length")
        ]
        return httpx.Response(
            streamed.status_code, headers=headers, content=content, request=request
        )

    async def _read_capped(self, method: str, path: str, streamed: httpx.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in streamed.aiter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise self.permanent(
                        f"{method} {path} answered {streamed.status_code} with a body over "
                        f"{MAX_BODY_BYTES} bytes: not read",
                        status=streamed.status_code,
                    )
                chunks.append(chunk)
        except httpx.DecodingError as exc:
            encoding = streamed.headers.get("content-encoding", "")
            raise self.retryable(
                f"{method} {path} answered a body that cannot be decoded "
                f"(Content-Encoding {encoding!r}): {exc}"
            ) from None
        return b"".join(chunks)

    def unexpected(self, path: str, response: httpx.Response) -> PermanentEngineError:
        return self.permanent(
            f"{path} answered {response.status_code}: {error_text(response)}",
            status=response.status_code,
        )

    async def registered(self) -> Registered:
        response = await self.call("GET", "/v1/models")
        if response.status_code != 200:
            raise self.unexpected("/v1/models", response)
        return listing_from_body(response.content, pod=self._pod)

    async def health(self) -> bool:
        try:
            response = await self.call("GET", "/health")
        except RetryableEngineError:
            return False
        return response.status_code == 200

    async def served_model_name(self) -> str:
        """The base model's served name: given, or read once from ``/v1/models``."""
        if self._served_model_name is None:
            listed = await self.registered()
            if listed.base_model is None:
                raise self.permanent("/v1/models lists no base model to name in requests")
            self._served_model_name = listed.base_model
        return self._served_model_name

    async def scrape(self) -> str:
        response = await self.call("GET", "/metrics")
        if response.status_code != 200:
            raise self.unexpected("/metrics", response)
        return response.text


def retry_after_s(value: str | Sequence[str], *, now_s: float) -> float | None:
    """The seconds a ``Retry-After`` asks to wait (RFC 9110 section 10.2.3), pure.

    delta-seconds (ASCII digits) as they are; an HTTP-date (any of RFC 9110's three
    forms; one without a zone is GMT) counted from ``now_s`` (epoch seconds), 0 when it
    is already past. None for anything else (negative, a fraction, words, a bad date)
    and for a wait over ``MAX_RETRY_AFTER_S``: no wait is honoured for those.

    The header sent twice comes as several values, or as one joined with commas
    (``"5, 5"``): RFC 9110 makes Retry-After a singleton, but a proxy that repeats it
    means one wait, so it is honoured when every value reads to the same wait (two
    dates already past both read 0); values that differ, or one that cannot be read,
    give None; an empty value (``"5,"``, a second header line left empty) is no value.
    A date's own comma (``"Sun, 06 Nov 1994 ..."``) does not split it.
    """
    values = (value,) if isinstance(value, str) else tuple(value)
    texts = [one for v in values for one in _retry_afters(v)] or [""]
    waits = {_one_retry_after_s(one, now_s=now_s) for one in texts}
    return waits.pop() if len(waits) == 1 else None


def _retry_afters(value: str) -> list[str]:
    """The values a comma-joined ``Retry-After`` holds: a piece that is a weekday name
    is a date's (IMF-fixdate, RFC 850) and goes with the piece after it; empty pieces
    (``"5,"``) are no value."""
    pieces = [piece.strip() for piece in value.split(",")]
    values: list[str] = []
    for piece in pieces:
        if values and values[-1].lower() in _WEEKDAYS:
            values[-1] = f"{values[-1]}, {piece}"
        else:
            values.append(piece)
    return [one for one in values if one]


def _one_retry_after_s(text: str, *, now_s: float) -> float | None:
    if _DELTA_SECONDS.fullmatch(text):
        delay_s = float(int(text))
    else:
        try:
            when = parsedate_to_datetime(text)
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            delay_s = max(0.0, when.timestamp() - now_s)
        except (TypeError, ValueError, OverflowError):
            return None
    return delay_s if delay_s <= MAX_RETRY_AFTER_S else None


def listing_from_body(body: bytes, *, pod: str | None = None) -> Registered:
    """The adapters and base model of a ``/v1/models`` answer's body (its status was
    200): a PermanentEngineError naming what is wrong when it is not a model list."""
    try:
        listing = json.loads(body)
    except RecursionError:
        raise PermanentEngineError(
            "/v1/models answered a body that is not a model list: JSON nested too deep", pod=pod
        ) from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        text = _plain(httpx.Response(200, content=body), limit=200)
        raise PermanentEngineError(
            f"/v1/models answered a body that is not a model list: not JSON: {text!r}", pod=pod
        ) from None
    if not isinstance(listing, dict) or "data" not in listing:
        raise PermanentEngineError("/v1/models answered a body that is not a model list", pod=pod)
    return registered_from_cards(listing["data"], pod=pod)


def registered_from_cards(cards: object, *, pod: str | None = None) -> Registered:
    """The adapters (with their roots) and the base model of a ``/v1/models`` answer's
    ``data``: a card with a ``parent`` is an adapter of that base; the first card
    without one is the base. ``data`` that is not a list, or a card that is not an
    object with a string ``id``, is a PermanentEngineError naming it: read as "no
    adapters", it would empty the pod's ledger."""
    if not isinstance(cards, list):
        raise PermanentEngineError(
            "/v1/models answered a body that is not a model list: "
            f'"data" is a JSON {_json_kind(cards)}, not an array',
            pod=pod,
        )
    adapters: dict[AdapterId, str] = {}
    base: str | None = None
    for index, card in enumerate(cards):
        if not isinstance(card, dict) or not isinstance(card.get("id"), str) or not card["id"]:
            raise PermanentEngineError(
                f'/v1/models answered a model list whose card {index} has no string "id": '
                f"{_short(repr(card))}",
                pod=pod,
            )
        if card.get("parent"):
            adapters[AdapterId(card["id"])] = str(card.get("root") or "")
            base = base or str(card["parent"])
        elif base is None:
            base = card["id"]
    return Registered(adapters=MappingProxyType(adapters), base_model=base)
