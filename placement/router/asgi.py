"""The router's HTTP face: a raw ASGI app (no framework on the hot path).

Routes: ``POST /v1/completions`` and ``/v1/chat/completions`` (proxied, streamed or
not), ``GET /v1/models`` (the adapters the plan serves), ``GET /healthz`` (liveness:
503 when a loop ended or is stuck), ``GET /readyz`` (503 also without a plan where
one is expected, or without a healthy pod), ``GET /metrics``, ``GET /v1/unplanned``
(adapters requested but not in the plan, for the controller). The ASGI lifespan
starts and stops the ``Router``'s loops.

Owns the request's way through: the front door (``router.front``: size, JSON, names),
the retry on another pod, the pass-through of bytes, the request-log row and the
metrics of each request. A name the router does not know shares the ``_unknown``
label; with a catalog, such a name is answered 404 here (no pod could load it), else
it goes to its hashed pod as it is, outside the ledger. Must not make routing
decisions.

A proxied request served by the router's own server (``router.http_cycle``) with no
middleware wrapping its ``send`` is read and answered through its ``RequestCycle``
(``cycle_of``); behind middleware or another server, over ASGI messages. Both ways to
the client, and the watch for it going away, are ``router.client_side``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from placement.domain import AdapterId, Engine, PodId
from placement.errors import PermanentEngineError, RetryableEngineError
from placement.router.client_side import (
    JSON_HEADERS,
    WATCH_AFTER_S,
    AsgiClient,
    ClientGone,
    ClientSide,
    DisconnectWatcher,
    Receive,
    Send,
    respond,
)
from placement.router.cold_loads import LoadHeldError, hold_refusal, load_failure_level
from placement.router.core import Router
from placement.router.forward import Client, Exchange, forward
from placement.router.front import Refusal, body_too_large, parse_request, read_body
from placement.router.http_cycle import cycle_of
from placement.router.metrics import CONTENT_TYPE
from placement.router.picking import Choice, Reject
from placement.router.reqlog import LogRow
from placement.router.upstream import PoolFullError
from placement.router.warmups import send_warmups

Scope = MutableMapping[str, Any]

log = logging.getLogger("lorafleet.router")

_PROXIED = frozenset({"/v1/completions", "/v1/chat/completions"})
_JSON = JSON_HEADERS


def _error(message: str, kind: str, *, param: str | None = None, code: int) -> bytes:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json.dumps(body).encode()


class RouterApp:
    """ASGI callable around a ``Router``; ``router`` is public for tests and the demo."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.router.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.router.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path in _PROXIED and method == "POST":
            await self._proxy(scope, receive, send)
        elif method != "GET":
            await respond(send, 405, _error("method not allowed", "NotFoundError", code=405))
        elif path == "/metrics":
            body = self.router.metrics.render()
            await respond(send, 200, body, [(b"content-type", CONTENT_TYPE.encode())])
        elif path == "/v1/models":
            await respond(send, 200, json.dumps(self._models()).encode())
        elif path in ("/healthz", "/health"):
            health = self._health()
            await respond(send, 200 if health["status"] == "ok" else 503, _json(health))
        elif path == "/readyz":
            reasons = self.router.not_ready()
            ready = {"ready": not reasons, "reasons": reasons}
            await respond(send, 503 if reasons else 200, _json(ready))
        elif path == "/v1/unplanned":
            counts = dict(self.router.unplanned.most_common())
            await respond(send, 200, json.dumps({"adapters": counts}).encode())
        else:
            await respond(send, 404, json.dumps({"detail": "Not Found"}).encode())

    def _models(self) -> dict[str, Any]:
        topology = self.router.topology
        cards = [
            {"id": view.served_model, "object": "model", "owned_by": "lorafleet", "parent": None}
            for view in topology.pools.values()
        ]
        for adapter in topology.served:
            pool = topology.pools.get(topology.adapter_pool[adapter])
            parent = pool.served_model if pool is not None else None
            cards.append(
                {"id": adapter, "object": "model", "owned_by": "lorafleet", "parent": parent}
            )
        return {"object": "list", "data": cards}

    def _health(self) -> dict[str, Any]:
        topology = self.router.topology
        healthy = sorted(s.upstream.pod for s in topology.pods.values() if s.healthy)
        problems = self.router.problems()
        loops = self.router.supervisor.loops
        return {
            "status": "failing" if problems else "ok",
            "problems": problems,
            "loops": {name: health.as_json() for name, health in loops.items()},
            "plan": topology.plan.id if topology.plan is not None else None,
            "routing": "plan" if topology.plan is not None else "hashing",
            "plan_problem": self.router.plan_error,
            "pods": len(topology.pods),
            "healthy_pods": healthy,
        }

    # -- proxying --------------------------------------------------------------------

    async def _proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        router = self.router
        exchange = Exchange(started_s=router.timer(), arrived_s=router.clock(), path=scope["path"])
        headers = scope.get("headers", ())
        # The router's own server, with no middleware between: its cycle's methods, not
        # ASGI messages, and its word when the client goes away.
        cycle = cycle_of(send)
        client: ClientSide = cycle if cycle is not None else AsgiClient(receive, send)
        max_bytes = router.settings.max_body_bytes
        whole = client.body_now()
        if whole is None:
            try:
                body = await read_body(client.receive, headers, max_bytes=max_bytes)
            except ConnectionResetError:
                return
        else:
            body = whole if len(whole) <= max_bytes else body_too_large(max_bytes)
        refusal = body if isinstance(body, Refusal) else None
        if refusal is None:
            assert isinstance(body, bytes)
            exchange.body = body
            refusal = parse_request(
                exchange,
                headers,
                max_depth=router.settings.max_json_depth,
                base_models=router.topology.base_pool.keys(),
            )
        if refusal is not None:  # no label, no log row: the request never got a name
            router.metrics.refused.labels(reason=refusal.reason).inc()
            kind = "RequestTooLargeError" if refusal.status == 413 else "BadRequestError"
            message = _error(refusal.message, kind, param=refusal.param, code=refusal.status)
            await client.answer(refusal.status, _JSON, message)
            return
        exchange.known = router.knows(exchange.model)
        if not exchange.known and router.adapters.sources:
            await self._refuse(exchange, Choice(None, reject=Reject.UNKNOWN_MODEL), client)
            self._record(exchange)
            return
        timer: asyncio.TimerHandle | None = None
        if cycle is not None:
            # The cycle's loop runs this task: current_task() without it asks for the
            # running loop, which costs a getpid() system call on Python 3.11.
            handler = asyncio.current_task(cycle.loop)
            cycle.on_lost = ClientGone(handler, exchange)
        else:
            handler = asyncio.current_task()
            # Most answers are over before a client could go away: the watcher starts
            # only once a request has taken WATCH_AFTER_S (a timer costs less than a task).
            watcher = DisconnectWatcher(receive, handler, exchange)
            timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watcher.start)
        try:
            await self._route(exchange, client)
        except asyncio.CancelledError:
            if not exchange.client_gone or handler is None:
                raise
            handler.uncancel()
            exchange.status = 499
        except (TimeoutError, OSError) as exc:  # router.upstream's errors are both
            # The pod failed in the middle of a streamed answer: nothing more can be sent.
            log.warning("upstream %s failed mid-response: %s", exchange.pod, exc)
            exchange.status = 502
        finally:
            if cycle is not None:
                cycle.on_lost = None
            elif timer is not None:
                timer.cancel()
                watcher.cancel()
            self._record(exchange)

    async def _route(self, exchange: Exchange, client: ClientSide) -> None:
        router = self.router
        exclude: frozenset[PodId] = frozenset()
        adapter = AdapterId(exchange.model)
        attempt = 0
        cause: str | None = "none"  # what the request waited on; None once observed
        while attempt < 2:  # two pods at most, and one reload on a pod that lost the adapter
            # Pods whose Retry-After holds back the load this request needs: left out of
            # the pick, not tried (``ColdLoads.held_for``).
            held = router.cold_loads.held_for(router.topology, adapter) if exchange.known else {}
            choice, pressed = await self._choose(exchange, exclude.union(held) if held else exclude)
            cause = "pressure" if pressed and cause is not None else cause
            if choice.pod is None:
                if held and choice.reject == Reject.NO_POD:
                    await self._held_back(exchange, held, client)
                else:
                    await self._refuse(exchange, choice, client)
                return
            state = choice.pod
            # A name the router does not know stays out of the ledger: the pod will
            # most likely refuse it, and it must not push real adapters out of the model.
            outcome = choice.outcome if exchange.known else None
            exchange.pod, exchange.outcome = state.upstream.pod, outcome
            if choice.unplanned and attempt == 0:
                label = self._label(exchange)
                router.unplanned[AdapterId(label)] += 1
                router.metrics.unplanned.labels(adapter=label).inc()
            if outcome is not None and choice.refresh:  # class warm-ups first (class_priority)
                await send_warmups(router, state, choice.refresh)
            try:
                if outcome is not None and router.needs_load(state, adapter):
                    cause = "load" if cause is not None else None
                    await router.load(state, adapter)
            except PermanentEngineError as exc:
                await self._load_failed(exchange, exc, client)
                return
            except LoadHeldError as exc:  # a hold begun since the pick: not an attempt
                level = load_failure_level(exc)  # a hold's repeats: DEBUG
                log.log(level, "loading %s on %s failed: %s", adapter, state.upstream.pod, exc)
                exclude = exclude | {state.upstream.pod}
                continue
            except (RetryableEngineError, OSError) as exc:
                log.warning("loading %s on %s failed: %s", adapter, state.upstream.pod, exc)
            else:
                if cause is not None:  # the first forwarding: the request's queue time
                    router.metrics.request_queued(cause, router.timer() - exchange.started_s)
                    cause = None
                try:
                    if await forward(router, state, exchange, client, last_try=attempt == 1):
                        return
                except PoolFullError as exc:  # the router's limit: the pod is not to blame
                    await self._busy(exchange, str(exc), client)
                    return
                except (TimeoutError, OSError) as exc:
                    if exchange.streamed_bytes:
                        raise
                    router.mark_unhealthy(state, f"{type(exc).__name__}: {exc}")
            router.metrics.retries.inc()
            if exchange.adapter_gone:  # the same pod again, where it is loaded first
                exchange.adapter_gone = False
                continue
            exclude = exclude | {state.upstream.pod}
            attempt += 1
        exchange.status = 502
        exchange.finished = True
        message = _error("every pod tried failed", "BadGatewayError", code=502)
        await client.answer(502, _JSON, message)

    async def _busy(self, exchange: Exchange, why: str, client: Client) -> None:
        """The router has no upstream connection free: 503, retry later."""
        log.warning("request for %s refused: %s", exchange.model, why)
        exchange.status = 503
        exchange.finished = True
        retry_after = str(self.router.settings.retry_after_s).encode()
        headers = [*_JSON, (b"retry-after", retry_after)]
        message = f"the router is at its upstream connection limit ({why}); retry later"
        await client.answer(503, headers, _error(message, "ServiceUnavailableError", code=503))

    async def _held_back(
        self, exchange: Exchange, held: Mapping[PodId, float], client: Client
    ) -> None:
        """Only pods whose Retry-After holds back the load the request needs could serve
        it: 503 naming them, Retry-After the soonest hold's end."""
        exchange.status = 503
        exchange.finished = True
        message, retry_after_s = hold_refusal(exchange.model, held)
        headers = [*_JSON, (b"retry-after", str(retry_after_s).encode())]
        await client.answer(503, headers, _error(message, "ServiceUnavailableError", code=503))

    async def _load_failed(
        self, exchange: Exchange, exc: PermanentEngineError, client: Client
    ) -> None:
        """The pod refused to load the adapter (bad path, rank too large): say so."""
        exchange.status = 502
        exchange.finished = True
        message = f"loading {exchange.model} failed: {exc}"
        await client.answer(502, _JSON, _error(message, "BadGatewayError", param="model", code=502))

    async def _choose(self, exchange: Exchange, exclude: frozenset[PodId]) -> tuple[Choice, bool]:
        """Pick a pod; under soft memory pressure wait a little for room before refusing
        (True: it waited)."""
        router = self.router
        choice = router.picker.pick(router.topology, exchange.model, exclude=exclude)
        waited_s = 0.0
        limit_s = router.settings.pressure_wait_s
        step_s = min(router.settings.scrape_interval_s, limit_s / 4)
        while choice.reject == Reject.PRESSURE_WAIT and waited_s < limit_s:
            await asyncio.sleep(step_s)
            waited_s += step_s
            choice = router.picker.pick(router.topology, exchange.model, exclude=exclude)
        return choice, waited_s > 0.0

    async def _refuse(self, exchange: Exchange, choice: Choice, client: Client) -> None:
        settings = self.router.settings
        exchange.finished = True
        if choice.reject == Reject.UNKNOWN_MODEL:
            exchange.status = 404
            message = f"The model `{exchange.model}` does not exist."
            body = _error(message, "NotFoundError", param="model", code=404)
            await client.answer(404, _JSON, body)
            return
        exchange.status = 503
        if choice.reject == Reject.NO_POD:
            message = "no healthy pod serves this model"
        else:
            message = "every pod for this model is under memory pressure; retry later"
        headers = [*_JSON, (b"retry-after", str(settings.retry_after_s).encode())]
        await client.answer(503, headers, _error(message, "ServiceUnavailableError", code=503))

    def _record(self, exchange: Exchange) -> None:
        router = self.router
        outcome = exchange.outcome.value if exchange.outcome is not None else None
        label = outcome if exchange.status < 400 and outcome else _failure_label(exchange.status)
        ttft_s = exchange.ttft_s
        router.metrics.request(self._label(exchange), label, ttft_s)
        if router.request_log.sink is not None:
            router.request_log.append(
                LogRow(  # positional: keywords would double the cost of building it
                    exchange.arrived_s,
                    exchange.model,
                    exchange.tenant,
                    exchange.prompt_tokens,
                    exchange.output_tokens,
                    exchange.pod,
                    outcome if exchange.status < 400 else None,
                    None if ttft_s is None else ttft_s * 1000.0,
                    exchange.status,
                )
            )

    def _label(self, exchange: Exchange) -> str:
        """The bounded ``adapter`` label of the request's model."""
        return self.router.metrics.adapter_label(exchange.model, known=exchange.known)


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


def _failure_label(status: int) -> str:
    if status == 499:
        return "cancelled"
    if status == 503:
        return "rejected"
    return "error" if status >= 400 else "base"


def create_router_app(router: Router) -> RouterApp:
    return RouterApp(router)


__all__ = ["Engine", "RouterApp", "create_router_app"]
