"""One client request on its way to one pod: parsing, rewriting and byte pass-through.

``Exchange`` carries what the request log and the metrics need about one request.
``forward`` sends it to a pod and streams the answer back unchanged (SSE included),
noting the time to first byte and the token counts. It returns False, having sent
nothing to the client, when the pod answered 503 and another pod may be tried; a
connection error propagates for the same reason. Once a byte went to the client the
request is never retried.

It also returns False, once per pod, when the pod does not have the adapter the ledger
said it had (a plan unloaded it since the last listing), so that the caller loads it
and tries again: vLLM answers 404; SGLang answers 400 "The following requested LoRA
adapters are not loaded" (or, since its soft cap, "Got LoRA adapter that has never been
loaded"), or, streaming, 200 and that error as the first event, which is read before
anything goes to the client.

The request was read and checked at the front door (``router.front``) first. The
answer goes to a ``Client``: the router's own server's ``RequestCycle`` (no ASGI
messages), or ASGI's ``send`` wrapped by ``router.client_side.AsgiClient``.

``forward`` takes a ``Relay``: the few parts of the router it uses (the upstream
client, ``router.upstream``; the clock, the timer, the metrics), not the router itself.
The answer's bytes come back as the pod wrote them (no decompression), chunk by chunk
for a stream; a pod that cannot be reached or answers what is not HTTP raises an
``OSError`` naming it (``UpstreamError``, ``UpstreamTimeoutError``).

Must not choose pods: the caller passes the one ``picking`` chose.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from placement.adapters.sglang import adapter_request
from placement.clock import Clock
from placement.domain import AdapterId, Engine, Outcome
from placement.router.metrics import RouterMetrics
from placement.router.state import LivePod
from placement.router.upstream import Reply, Upstreams

Headers = list[tuple[bytes, bytes]]


class Client(Protocol):
    """Where a request's answer goes: the client's connection (``router.http_cycle``'s
    ``RequestCycle``, or ASGI's ``send`` through ``router.client_side.AsgiClient``)."""

    async def answer(self, status: int, headers: Headers, body: bytes) -> None:
        """A whole answer; its Content-Length is added here."""
        ...

    async def begin(self, status: int, headers: Headers) -> None:
        """A stream's status and headers."""
        ...

    async def part(self, body: bytes) -> None: ...

    async def end(self, body: bytes = b"") -> None: ...


_TAIL_BYTES = 4096
#: SGLang's refusals of an adapter it does not serve: the registry's "The following
#: requested LoRA adapters are not loaded" (python/sglang/srt/lora/lora_registry.py) and,
#: since the soft cap, the tokenizer manager's "Got LoRA adapter that has never been
#: loaded" (python/sglang/srt/managers/tokenizer_manager.py, ``_resolve_lora_path``).
SGLANG_NOT_LOADED = (b"requested LoRA adapters are not loaded", b"has never been loaded")
#: How much of a stream is held back looking for the end of its first event.
_FIRST_EVENT_BYTES = 65536


class Relay(Protocol):
    """What ``forward`` needs from the router (``router.core.Router`` is one)."""

    @property
    def session(self) -> Upstreams | None:
        """The upstream client (its pools, its timeouts); None before the router started."""
        ...

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
    #: The parsed body, once ``front.parse_request`` has read it (None before: no
    #: dict is made per request for it).
    payload: Mapping[str, Any] | None = None
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
    #: The last pod tried does not have the adapter we thought it held: retry it there.
    adapter_gone: bool = False
    #: Pods that lost the adapter once already (a second refusal there goes to the client).
    #: (A frozenset, replaced on a reload: no set is made per request.)
    reloaded_on: frozenset[str] = frozenset()
    client_gone: bool = False
    finished: bool = False
    #: The router knows ``model`` (``Router.knows``): only then is it an adapter the
    #: ledger tracks and a label of its own in the metrics.
    known: bool = True

    def body_for(self, state: LivePod) -> bytes:
        """The body as the pod's engine wants it: SGLang names ``<base>:<adapter>`` and
        ``lora_path: <adapter>`` (older SGLang reads only the latter)."""
        upstream = state.upstream
        if upstream.engine is not Engine.SGLANG or self.model == upstream.served_model:
            return self.body
        rewritten = adapter_request(
            upstream.served_model, AdapterId(self.model), dict(self.payload or {})
        )
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
        relay.metrics.activation(state.upstream.pod)


async def forward(
    relay: Relay, state: LivePod, exchange: Exchange, client: Client, *, last_try: bool
) -> bool:
    """Send the request to ``state``'s pod and relay the answer; False means try another."""
    session = relay.session
    assert session is not None, "the router has not started"
    url = state.upstream.url + exchange.path
    body = exchange.body_for(state)
    adapter = AdapterId(exchange.model) if exchange.outcome is not None else None
    _note_admission(relay, state, exchange)
    held = state.begin(adapter)
    sent_s = relay.timer()
    ran = False  # the pod ran the request: its end was a step on the adapter
    try:
        # A whole answer is waited for whole: one wake-up, not one at its head and
        # another at its body.
        reply = await session.post(
            state.upstream.pod, url, body, auth=exchange.auth, whole=not exchange.stream
        )
        try:
            if reply.status == 503 and not last_try:
                await reply.read()
                return False
            head = await _head(state, exchange, reply)
            if adapter is not None and _adapter_missing(state, reply.status, head):
                # The pod no longer holds the adapter (a plan unloaded it since our last
                # listing): forget it, and try again, where it will be loaded first.
                state.ledger.forget(adapter)
                state.sync()
                if state.upstream.pod not in exchange.reloaded_on:
                    exchange.reloaded_on |= {state.upstream.pod}
                    exchange.adapter_gone = True
                    return False
            exchange.status = reply.status
            ran = reply.status == 200
            if exchange.stream and reply.status == 200:
                await _relay_stream(relay.timer, state, exchange, reply, client, head=head or b"")
            else:
                await _relay_whole(relay.timer, state, exchange, reply, client, data=head)
            return True
        finally:
            reply.release()
    finally:
        state.end(adapter, held=held, ran=ran, took_s=relay.timer() - sent_s if ran else None)


async def _head(state: LivePod, exchange: Exchange, reply: Reply) -> bytes | None:
    """What must be read before anything is relayed, to tell whether the pod has the
    adapter: the body of a 404 (or of an SGLang 400), the first event of an SGLang
    stream. None when nothing needs reading first."""
    if exchange.outcome is None:
        return None
    sglang = state.upstream.engine is Engine.SGLANG
    if reply.status == 404 or (sglang and reply.status == 400):
        return await reply.read()
    if not (sglang and exchange.stream and reply.status == 200):
        return None
    head = b""
    while chunk := await reply.chunk():
        head += chunk
        if b"\n\n" in head or len(head) >= _FIRST_EVENT_BYTES:
            break
    return head


def _adapter_missing(state: LivePod, status: int, head: bytes | None) -> bool:
    """vLLM's 404 for a name it does not list; SGLang's "not loaded" (400, or streamed)."""
    if status == 404:
        return True
    if state.upstream.engine is not Engine.SGLANG or head is None:
        return False
    first_event = head.split(b"\n\n", 1)[0]
    return status in (200, 400) and any(text in first_event for text in SGLANG_NOT_LOADED)


def _reply_headers(reply: Reply) -> Headers:
    headers = [(b"content-type", reply.headers.get(b"content-type", b"application/json"))]
    retry_after = reply.headers.get(b"retry-after")
    if retry_after is not None:
        headers.append((b"retry-after", retry_after))
    return headers


async def _relay_whole(
    timer: Clock,
    state: LivePod,
    exchange: Exchange,
    reply: Reply,
    client: Client,
    *,
    data: bytes | None = None,
) -> None:
    if data is None:
        data = await reply.read()
    exchange.ttft_s = timer() - exchange.started_s
    state.observe_ttfb(exchange.ttft_s * 1000.0)
    if reply.status == 200:
        _usage_from_text(exchange, data)
    exchange.streamed_bytes = True
    await client.answer(reply.status, _reply_headers(reply), data)
    exchange.finished = True  # before any await: a disconnect now is not a cancellation


async def _relay_stream(
    timer: Clock,
    state: LivePod,
    exchange: Exchange,
    reply: Reply,
    client: Client,
    *,
    head: bytes = b"",
) -> None:
    """Relay the stream; ``head`` is its beginning, read already (``_head``)."""
    headers = _reply_headers(reply)
    headers.append((b"cache-control", b"no-cache"))
    exchange.streamed_bytes = True
    await client.begin(reply.status, headers)
    events = 0
    tail = b""
    async for chunk in _chunks(head, reply):
        if exchange.ttft_s is None:
            exchange.ttft_s = timer() - exchange.started_s
            state.observe_ttfb(exchange.ttft_s * 1000.0)
        events += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
        tail = (tail + chunk)[-_TAIL_BYTES:]
        await client.part(chunk)
    await client.end()
    exchange.finished = True
    exchange.output_tokens = events
    _usage_from_tail(exchange, tail)


async def _chunks(head: bytes, reply: Reply) -> AsyncIterator[bytes]:
    if head:
        yield head
    while chunk := await reply.chunk():
        yield chunk


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
