"""One client request on its way to one pod: parsing, rewriting and byte pass-through.

``Exchange`` carries what the request log and the metrics need about one request.
``forward`` sends it to a pod and streams the answer back unchanged (SSE included),
noting the time to first byte and the token counts. It returns False, having sent
nothing to the client, when the pod answered 503 and another pod may be tried; a
connection error propagates for the same reason. Once a byte went to the client the
request is never retried.

``forward`` takes a ``Relay``: the few parts of the router it uses (the upstream
session and its timeout, the clock, the timer, the metrics), not the router itself.

Must not choose pods: the caller passes the one ``picking`` chose.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from placement.clock import Clock
from placement.domain import AdapterId, Engine, Outcome
from placement.router.metrics import RouterMetrics
from placement.router.state import LivePod

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_PASSED_HEADERS = (b"authorization",)
_JSON_HEADERS = {"content-type": "application/json"}
_TAIL_BYTES = 4096


class Relay(Protocol):
    """What ``forward`` needs from the router (``router.core.Router`` is one)."""

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The upstream session; None before the router started."""
        ...

    @property
    def upstream_timeout(self) -> aiohttp.ClientTimeout: ...

    @property
    def clock(self) -> Clock:
        """Epoch seconds the router decides by: when an adapter was last routed."""
        ...

    @property
    def timer(self) -> Clock:
        """Seconds for measuring latencies (time to first byte) only."""
        ...

    @property
    def metrics(self) -> RouterMetrics: ...


@dataclass(kw_only=True, slots=True)
class Exchange:
    #: On the router's timer: the start of the time to first byte.
    started_s: float
    #: On the router's clock: the arrival the request log records.
    arrived_s: float
    path: str
    body: bytes = b""
    payload: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    stream: bool = False
    tenant: str | None = None
    auth: bytes | None = None
    pod: str | None = None
    outcome: Outcome | None = None
    status: int = 0
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    #: Something went to the client: the request can no longer be retried.
    streamed_bytes: bool = False
    #: The last pod tried answered 404 for an adapter we thought it held: retry it there.
    adapter_gone: bool = False
    #: Pods that lost the adapter once already (a second 404 there goes to the client).
    reloaded_on: set[str] = field(default_factory=set)
    client_gone: bool = False
    finished: bool = False

    def parse(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """Read the JSON body; a message for the client when it is not a usable request."""
        try:
            payload = json.loads(self.body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "the request body is not valid JSON"
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            return "the request needs a string field 'model' (the adapter's name)"
        self.payload = payload
        self.model = payload["model"]
        self.stream = bool(payload.get("stream"))
        user = payload.get("user")
        self.tenant = user if isinstance(user, str) else None
        for name, value in headers:
            if name == b"x-tenant":
                self.tenant = value.decode("latin-1")
            elif name in _PASSED_HEADERS:
                self.auth = value
        return None

    def body_for(self, state: LivePod) -> bytes:
        """The body as the pod's engine wants it: SGLang names ``<base>:<adapter>``."""
        upstream = state.upstream
        if upstream.engine is not Engine.SGLANG or self.model == upstream.served_model:
            return self.body
        rewritten = dict(self.payload, model=f"{upstream.served_model}:{self.model}")
        return json.dumps(rewritten).encode()

    def read_usage(self, usage: object) -> None:
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            self.prompt_tokens = prompt if isinstance(prompt, int) else self.prompt_tokens
            self.output_tokens = completion if isinstance(completion, int) else self.output_tokens


def _note_admission(relay: Relay, state: LivePod, exchange: Exchange) -> None:
    """The request takes a GPU slot on the pod: update the ledger, count activations."""
    if exchange.outcome is None:
        return
    state.note_use(AdapterId(exchange.model), relay.clock())
    if exchange.outcome is Outcome.CPU_HIT:
        relay.metrics.loads.labels(pod=state.upstream.pod, reason="activation").inc()


async def forward(
    relay: Relay, state: LivePod, exchange: Exchange, send: Send, *, last_try: bool
) -> bool:
    """Send the request to ``state``'s pod and relay the answer; False means try another."""
    session = relay.session
    assert session is not None, "the router has not started"
    headers = _JSON_HEADERS
    if exchange.auth is not None:
        headers = {**_JSON_HEADERS, "authorization": exchange.auth.decode("latin-1")}
    url = state.upstream.url + exchange.path
    body = exchange.body_for(state)
    _note_admission(relay, state, exchange)
    state.begin()
    try:
        async with session.post(
            url, data=body, headers=headers, timeout=relay.upstream_timeout
        ) as reply:
            if reply.status == 503 and not last_try:
                await reply.read()
                return False
            if reply.status == 404 and exchange.outcome is not None:
                # The pod no longer holds the adapter (a plan unloaded it since our last
                # listing): forget it, and try again, where it will be loaded first.
                state.ledger.forget(AdapterId(exchange.model))
                state.sync()
                if state.upstream.pod not in exchange.reloaded_on:
                    await reply.read()
                    exchange.reloaded_on.add(state.upstream.pod)
                    exchange.adapter_gone = True
                    return False
            exchange.status = reply.status
            if exchange.stream and reply.status == 200:
                await _relay_stream(relay.timer, state, exchange, reply, send)
            else:
                await _relay_whole(relay.timer, state, exchange, reply, send)
            return True
    finally:
        state.end()


def _reply_headers(reply: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", reply.headers.get("content-type", "application/json").encode())]
    retry_after = reply.headers.get("retry-after")
    if retry_after is not None:
        headers.append((b"retry-after", retry_after.encode()))
    return headers


async def _relay_whole(
    timer: Clock,
    state: LivePod,
    exchange: Exchange,
    reply: aiohttp.ClientResponse,
    send: Send,
) -> None:
    data = await reply.read()
    exchange.ttft_s = timer() - exchange.started_s
    state.observe_ttfb(exchange.ttft_s * 1000.0)
    if reply.status == 200:
        _usage_from_text(exchange, data)
    headers = _reply_headers(reply)
    headers.append((b"content-length", str(len(data)).encode()))
    exchange.streamed_bytes = True
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
    exchange.finished = True  # before any await: a disconnect now is not a cancellation


async def _relay_stream(
    timer: Clock,
    state: LivePod,
    exchange: Exchange,
    reply: aiohttp.ClientResponse,
    send: Send,
) -> None:
    headers = _reply_headers(reply)
    headers.append((b"cache-control", b"no-cache"))
    exchange.streamed_bytes = True
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    events = 0
    tail = b""
    async for chunk in reply.content.iter_any():
        if exchange.ttft_s is None:
            exchange.ttft_s = timer() - exchange.started_s
            state.observe_ttfb(exchange.ttft_s * 1000.0)
        events += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
        tail = (tail + chunk)[-_TAIL_BYTES:]
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    exchange.finished = True
    exchange.output_tokens = events
    _usage_from_tail(exchange, tail)


_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def _usage_from_text(exchange: Exchange, data: bytes) -> None:
    """Token counts from an OpenAI body's ``usage``, without parsing the whole body."""
    prompt = _PROMPT_TOKENS.search(data)
    completion = _COMPLETION_TOKENS.search(data)
    if prompt is not None:
        exchange.prompt_tokens = int(prompt.group(1))
    if completion is not None:
        exchange.output_tokens = int(completion.group(1))


def _usage_from_tail(exchange: Exchange, tail: bytes) -> None:
    """With ``stream_options.include_usage`` the last event before [DONE] has the counts."""
    if b'"usage"' not in tail:
        return
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                exchange.read_usage(json.loads(line[6:]).get("usage"))
            return
