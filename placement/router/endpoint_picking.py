"""The endpoint picker's side of one request: the proxy's routing, without the bytes.

In endpoint-picker mode a gateway (Envoy, speaking ``router.picker_grpc``) sends the
request itself; lorafleet only says where. Everything that decides is the proxy's own:
the front door (``router.front``: size, JSON, names), the ``Picker`` over the
``Router``'s topology (the plan, the ledger, the pressure rules of
``policies.routing``), the coalesced loads (``Router.load``: a cold adapter is loaded
once per pod however many streams ask), the metrics and the request log. So a request
through the gateway leaves the same ledger, counters and log row as one through the
proxy.

One ``GatewayRequest`` per request (one gateway stream):

- ``decide(body)``: the front door, the pick (waiting out soft memory pressure as the
  proxy does), the load of a cold adapter, the admission into the ledger; a ``Picked``
  (endpoints as ``host:port``, the chosen pod first, then at most one fallback that
  already holds the adapter, for the gateway's own retry) or a ``Refused`` (the status
  and the OpenAI error the gateway answers with);
- ``decide_without_body()``: a request with no body (a GET) goes to the least loaded pod;
- ``served``, ``response_status``, ``response_bytes``: the answer as the gateway reports
  it: which endpoint served (a fallback means the chosen pod failed: it leaves the
  rotation until a good scrape), the status, the time to first byte and the tokens;
- ``finish()``: the end of the request in the pod's in-flight count, and its log row.

The answer and the end are ``router.gateway_answer``'s (``GatewayAnswer``, the base of
``GatewayRequest``; this module imports it, never the other way); the decision is here.

Must not speak gRPC (``router.picker_grpc`` does) nor send requests to pods itself
(loads go through the ``Router``, class warm-ups through ``router.warmups``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from placement.domain import AdapterId, Outcome, PodId
from placement.errors import PermanentEngineError, RetryableEngineError
from placement.router.cold_loads import LoadHeldError, hold_refusal, load_failure_level
from placement.router.front import body_too_large, parse_request
from placement.router.gateway_answer import GatewayAnswer, endpoint_of
from placement.router.picking import Choice, Reject
from placement.router.state import LivePod, Topology
from placement.router.warmups import send_warmups

log = logging.getLogger("lorafleet.router")


@dataclass(frozen=True, slots=True)
class Picked:
    """Where the gateway sends the request: ``endpoints[0]``, then the fallbacks."""

    endpoints: tuple[str, ...]
    #: The body the pod wants, when it differs from the client's (SGLang's model name).
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """The answer the gateway gives in place of a pod's: an OpenAI error."""

    status: int
    message: str
    kind: str
    param: str | None = None
    retry_after_s: int | None = None


def pods_outside(topology: Topology, subset: frozenset[str] | None) -> frozenset[PodId]:
    """The pods the gateway's subset hint leaves out (none without a hint)."""
    if subset is None:
        return frozenset()
    return frozenset(
        pod for pod, state in topology.pods.items() if endpoint_of(state.upstream) not in subset
    )


class GatewayRequest(GatewayAnswer):
    """One request the gateway asks about, from its headers to the end of its answer:
    the decision here, the answer and the end in ``GatewayAnswer``."""

    # -- deciding --------------------------------------------------------------------

    def too_large(self, size_bytes: int) -> Refused | None:
        """A 413 once the body (so far, or as declared) is over the router's limit."""
        limit = self.router.settings.max_body_bytes
        if size_bytes <= limit:
            return None
        refusal = body_too_large(limit)
        self.router.metrics.refused.labels(reason=refusal.reason).inc()
        return Refused(413, refusal.message, "RequestTooLargeError")

    async def decide(self, body: bytes) -> Picked | Refused:
        router, exchange = self.router, self.exchange
        exchange.body = body
        refusal = parse_request(
            exchange,
            self.headers,
            max_depth=router.settings.max_json_depth,
            base_models=router.topology.base_pool.keys(),
        )
        if refusal is not None:  # no label, no log row: the request never got a name
            router.metrics.refused.labels(reason=refusal.reason).inc()
            kind = "RequestTooLargeError" if refusal.status == 413 else "BadRequestError"
            return Refused(refusal.status, refusal.message, kind, param=refusal.param)
        self.named = True
        exchange.known = router.knows(exchange.model)
        if not exchange.known and router.adapters.sources:
            return self._refuse(Choice(None, reject=Reject.UNKNOWN_MODEL))
        return await self._route()

    def decide_without_body(self) -> Picked | Refused:
        """A request without a body names no model: the least loaded pod of the pool
        (the one a ``x-gateway-model-name`` header names, else the first)."""
        topology = self.router.topology
        named = next((v for k, v in self.headers if k == b"x-gateway-model-name"), None)
        pool = topology.pool_of(named.decode("latin-1")) if named else None
        if pool is None and topology.pools:
            pool = topology.pools[min(topology.pools)]
        if pool is None:
            return self._refuse(Choice(None, reject=Reject.NO_POD))
        exclude = pods_outside(topology, self.subset)
        choice = self.router.picker.pick(topology, pool.served_model, exclude=exclude)
        if choice.pod is None:
            return self._refuse(choice)
        self._admit(choice.pod, None)
        return Picked(endpoints=(endpoint_of(choice.pod.upstream),))

    async def _route(self) -> Picked | Refused:
        """The proxy's ``_route`` up to the send: two pods at most when loads fail."""
        router, exchange = self.router, self.exchange
        adapter = AdapterId(exchange.model)
        exclude = pods_outside(router.topology, self.subset)
        attempt = 0
        while attempt < 2:
            # Pods whose Retry-After holds back the load the request needs: left out of
            # the pick, not tried (``ColdLoads.held_for``), as in the proxy.
            held = router.cold_loads.held_for(router.topology, adapter) if exchange.known else {}
            choice = await self._choose(exclude.union(held) if held else exclude)
            state = choice.pod
            if state is None:
                if held and choice.reject == Reject.NO_POD:
                    return self._held_back(held)
                return self._refuse(choice)
            # A name the router does not know stays out of the ledger (as in the proxy).
            outcome = choice.outcome if exchange.known else None
            exchange.pod, exchange.outcome = state.upstream.pod, outcome
            if choice.unplanned and attempt == 0:
                label = self._label()
                router.unplanned[AdapterId(label)] += 1
                router.metrics.unplanned.labels(adapter=label).inc()
            if outcome is not None and choice.refresh:  # class warm-ups first (class_priority)
                await send_warmups(router, state, choice.refresh)
            try:
                if outcome is not None and router.needs_load(state, adapter):
                    await router.load(state, adapter)
            except PermanentEngineError as exc:
                message = f"loading {exchange.model} failed: {exc}"
                return self._fail(502, message, param="model")
            except LoadHeldError as exc:  # a hold begun since the pick: not an attempt
                level = load_failure_level(exc)  # a hold's repeats: DEBUG
                log.log(level, "loading %s on %s failed: %s", adapter, state.upstream.pod, exc)
                exclude = exclude | {state.upstream.pod}
                continue
            except (RetryableEngineError, OSError) as exc:
                log.warning("loading %s on %s failed: %s", adapter, state.upstream.pod, exc)
                router.metrics.retries.inc()
                exclude = exclude | {state.upstream.pod}
                attempt += 1
                continue
            self._admit(state, outcome)
            body = exchange.body_for(state)
            return Picked(
                endpoints=(endpoint_of(state.upstream), *self._fallback(state, exclude)),
                body=None if body is exchange.body else body,
            )
        return self._fail(502, "every pod tried failed")

    async def _choose(self, exclude: frozenset[PodId]) -> Choice:
        """Pick a pod; under soft memory pressure wait a little for room, as the proxy."""
        router, model = self.router, self.exchange.model
        choice = router.picker.pick(router.topology, model, exclude=exclude)
        waited_s = 0.0
        limit_s = router.settings.pressure_wait_s
        step_s = min(router.settings.scrape_interval_s, limit_s / 4)
        while choice.reject == Reject.PRESSURE_WAIT and waited_s < limit_s:
            await asyncio.sleep(step_s)
            waited_s += step_s
            choice = router.picker.pick(router.topology, model, exclude=exclude)
        return choice

    def _fallback(self, chosen: LivePod, exclude: frozenset[PodId]) -> tuple[str, ...]:
        """Another healthy pod of the pool that needs no load for the request (the
        gateway sends there unloaded), not refusing for memory, least queued first:
        among the pods holding the adapter, or for a base model the least queued few
        (the pool's index has both). Not a second pick: a pick moves the round-robin
        cursor."""
        router, exchange = self.router, self.exchange
        pool = router.topology.pool_of(exchange.model)
        if pool is None:
            return ()
        adapter = AdapterId(exchange.model)
        held = exchange.outcome is not None
        index = pool.index
        positions = index.holders.get(adapter, ()) if held else index.least_queued
        best: LivePod | None = None
        for position in positions:
            state = index.states[position]
            if state is chosen or not state.healthy or state.pod_id in exclude:
                continue
            if state.kv_usage >= router.settings.reject_kv_usage:
                continue
            if held and (adapter in state.loading or not state.ledger.is_listed(adapter)):
                continue
            if best is None or state.queue_depth < best.queue_depth:
                best = state
        return () if best is None else (endpoint_of(best.upstream),)

    def _admit(self, state: LivePod, outcome: Outcome | None) -> None:
        """The request goes to ``state``: the engine activates its adapter there."""
        adapter = AdapterId(self.exchange.model) if outcome is not None else None
        if adapter is not None:
            state.note_use(adapter, self.router.clock())
            if outcome is Outcome.CPU_HIT:
                self.router.metrics.activation(state.upstream.pod)
        self.held = state.begin(adapter)
        self.state, self.busy = state, adapter

    def _refuse(self, choice: Choice) -> Refused:
        """No pod: 404 for a model nobody serves, else 503 with Retry-After."""
        exchange = self.exchange
        if choice.reject == Reject.UNKNOWN_MODEL:
            exchange.status = 404
            message = f"The model `{exchange.model}` does not exist."
            return Refused(404, message, "NotFoundError", param="model")
        exchange.status = 503
        if choice.reject == Reject.NO_POD:
            message = "no healthy pod serves this model"
        else:
            message = "every pod for this model is under memory pressure; retry later"
        retry_after_s = self.router.settings.retry_after_s
        return Refused(503, message, "ServiceUnavailableError", retry_after_s=retry_after_s)

    def _held_back(self, held: Mapping[PodId, float]) -> Refused:
        """Only pods whose Retry-After holds back the load the request needs could serve
        it: 503 naming them, Retry-After the soonest hold's end (as the proxy)."""
        self.exchange.status = 503
        message, retry_after_s = hold_refusal(self.exchange.model, held)
        return Refused(503, message, "ServiceUnavailableError", retry_after_s=retry_after_s)

    def _fail(self, status: int, message: str, *, param: str | None = None) -> Refused:
        self.exchange.status = status
        return Refused(status, message, "BadGatewayError", param=param)
