"""The gateway's side of one request after the pick: its answer, as the gateway reports
it, and the request's end.

``GatewayAnswer`` (the base of ``router.endpoint_picking.GatewayRequest``, which adds
the decision) holds one request's state from its headers on, and owns what follows the
pick: ``served`` (which endpoint served: a fallback means the chosen pod failed, and it
leaves the rotation until a good scrape), ``response_status`` and ``response_bytes``
(the status, the time to first byte, an adapter the pod no longer holds, the token
counts), and ``finish`` (the pod's in-flight count, the metrics and the log row).
Also ``endpoint_of``: a pod's ``host:port`` as the gateway names endpoints.

Must not decide where a request goes (``router.endpoint_picking`` does, and imports
this module, never the other way), speak gRPC, or send requests to pods.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from urllib.parse import urlsplit

from placement.domain import AdapterId, Engine
from placement.residency import Entry
from placement.router.core import Router
from placement.router.forward import SGLANG_NOT_LOADED, Exchange
from placement.router.reqlog import LogRow
from placement.router.state import LivePod, Upstream

#: The response's last bytes kept to read the token counts from (``usage`` comes last).
_TAIL_BYTES = 4096
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
#: Status logged for a request whose answer the gateway never reported (it went away).
GONE = 499


@lru_cache(maxsize=4096)
def _endpoint(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def endpoint_of(upstream: Upstream) -> str:
    """The pod's ``host:port``, as the gateway names endpoints (an InferencePool's
    ``podIP:targetPort``: the router's pod URLs from the selector are those)."""
    return _endpoint(upstream.url)


class GatewayAnswer:
    """One request's state, its answer as the gateway reports it, and its end."""

    def __init__(
        self,
        router: Router,
        headers: Iterable[tuple[bytes, bytes]],
        *,
        path: str,
        subset: frozenset[str] | None = None,
    ) -> None:
        self.router = router
        self.headers = tuple(headers)
        #: The endpoints the gateway allows (``x-gateway-destination-endpoint-subset``).
        self.subset = subset
        self.exchange = Exchange(started_s=router.timer(), arrived_s=router.clock(), path=path)
        #: The pod the request was admitted on, and the adapter it keeps busy there.
        self.state: LivePod | None = None
        self.busy: AdapterId | None = None
        #: What its ``begin`` there said it holds (the adapter's entry), for its end.
        self.held: Entry | AdapterId | None = None
        #: It passed the front door with a model name: it gets a log row.
        self.named = False
        self.streaming = False
        self.finished = False
        self._tail = b""
        self._events = 0

    # -- the answer, as the gateway reports it ----------------------------------------

    def served(self, endpoint: str, pods: Mapping[str, LivePod] | None = None) -> None:
        """The gateway says which endpoint served: another than the chosen one means
        the chosen pod failed (the gateway fell back): it leaves the rotation until a
        good scrape, and the request counts on the pod that served it."""
        state = self.state
        if state is None or not endpoint or endpoint == endpoint_of(state.upstream):
            return
        pods = pods if pods is not None else self._by_endpoint()
        serving = pods.get(endpoint)
        self.router.mark_unhealthy(state, f"the gateway fell back from it to {endpoint}")
        if serving is None:
            return
        state.end(self.busy, held=self.held)
        if self.busy is not None:
            self.exchange.outcome = serving.ledger.classify(self.busy)
            serving.note_use(self.busy, self.router.clock())
        self.held = serving.begin(self.busy)
        self.state = serving
        self.exchange.pod = serving.upstream.pod

    def _by_endpoint(self) -> dict[str, LivePod]:
        return {endpoint_of(s.upstream): s for s in self.router.topology.pods.values()}

    def response_status(self, status: int, *, content_type: str = "") -> None:
        self.exchange.status = status
        self.streaming = "text/event-stream" in content_type
        state, adapter = self.state, self.busy
        if status == 404 and state is not None and adapter is not None:
            self._adapter_gone(state, adapter)  # vLLM: the pod does not list the adapter

    def response_bytes(self, chunk: bytes, *, end: bool) -> None:
        exchange = self.exchange
        if exchange.ttft_s is None and (chunk or end):
            exchange.ttft_s = self.router.timer() - exchange.started_s
            if self.state is not None:
                self.state.observe_ttfb(exchange.ttft_s * 1000.0)
            if exchange.status == 400 and self._sglang_not_loaded(chunk):
                assert self.state is not None and self.busy is not None
                self._adapter_gone(self.state, self.busy)
        if self.streaming:
            self._events += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
        self._tail = (self._tail + chunk)[-_TAIL_BYTES:]
        if end:
            self._read_usage()

    def _sglang_not_loaded(self, head: bytes) -> bool:
        state = self.state
        if state is None or self.busy is None or state.upstream.engine is not Engine.SGLANG:
            return False
        return any(text in head for text in SGLANG_NOT_LOADED)

    def _adapter_gone(self, state: LivePod, adapter: AdapterId) -> None:
        """The pod no longer holds the adapter (a plan unloaded it since the last
        listing): forget it, so the next request loads it first."""
        state.ledger.forget(adapter)
        state.sync()

    def _read_usage(self) -> None:
        exchange = self.exchange
        if self.streaming:
            exchange.output_tokens = self._events
        prompt = _PROMPT_TOKENS.search(self._tail)
        completion = _COMPLETION_TOKENS.search(self._tail)
        if prompt is not None:
            exchange.prompt_tokens = int(prompt.group(1))
        if completion is not None:
            exchange.output_tokens = int(completion.group(1))

    # -- the end ---------------------------------------------------------------------

    def finish(self) -> None:
        """The stream ended: the pod's in-flight count, the metrics and the log row."""
        if self.finished:
            return
        self.finished = True
        if self.state is not None:
            # the pod ran the request: its end was a step on the adapter
            self.state.end(self.busy, held=self.held, ran=self.exchange.status == 200)
        if not self.named:
            return
        exchange = self.exchange
        if exchange.status == 0:
            exchange.status = GONE
        self._record()

    def _record(self) -> None:
        router, exchange = self.router, self.exchange
        outcome = exchange.outcome.value if exchange.outcome is not None else None
        status = exchange.status
        label = outcome if status < 400 and outcome else _failure_label(status)
        router.metrics.request(self._label(), label, exchange.ttft_s)
        router.request_log.append(
            LogRow(
                ts_s=exchange.arrived_s,
                adapter=exchange.model,
                tenant=exchange.tenant,
                prompt_tokens=exchange.prompt_tokens,
                output_tokens=exchange.output_tokens,
                pod=exchange.pod,
                outcome=outcome if status < 400 else None,
                ttft_ms=None if exchange.ttft_s is None else exchange.ttft_s * 1000.0,
                status=status,
            )
        )

    def _label(self) -> str:
        return self.router.metrics.adapter_label(self.exchange.model, known=self.exchange.known)


def _failure_label(status: int) -> str:
    if status == GONE:
        return "cancelled"
    if status == 503:
        return "rejected"
    return "error" if status >= 400 else "base"
