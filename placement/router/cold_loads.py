"""Coalesced cold loads: one load per pod per adapter, however many requests wait on it.

The first request for an adapter a pod lacks starts the load in a task of its own and
marks the pod as loading it (``LivePod.start_loading``), so the picker sends every later
request for it to this pod (stampede coalescing); they all wait on one future. That
future always settles: with the load's answer, with the engine's error, or, for a load
that ended otherwise (cancelled by ``Router.stop``, or by an error that is no engine's),
with a ``RetryableEngineError`` naming the pod and the adapter, so the proxy and the
endpoint picker treat it as any failed load (another pod, else 502). A load that ended
leaves the pod's loads, so the next request loads afresh.

A pod that refuses a load with a ``Retry-After`` (a 503 or 429 whose wait the engine
client read into ``RetryableEngineError.retry_after_s``) is sent no other load until
that wait is over, capped at ``MAX_LOAD_HOLD_S``, as the executor waits it (capped at
``ExecutorSettings.backoff_max_s``) before its retry. Before each pick the proxy and
the endpoint picker ask ``held_for`` which held pods a request would have to send a load
(not those listing its adapter, wherever the pod keeps it, nor those loading it: its
requests wait on that load) and leave them out of the pick, so a held pod costs a cold
request neither an attempt nor a retry, and requests for adapters it lists still go to
it. When only held pods
could serve it, the request is answered 503 naming them (``hold_refusal``), with a
Retry-After of the soonest hold's end. A load asked of a held pod all the same (a hold
begun between a pick and its load) fails at once, naming the wait, without reaching the
pod: a ``LoadHeldError``, after which the request is picked again without that pod, not
counted as an attempt. The first of each hold's refusals is said at WARNING by whoever
logs the failed load, the rest at DEBUG (``load_failure_level``).

Must not choose the pod (``router.picking`` does) nor answer a request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Mapping
from typing import Protocol

from placement.adapters.sglang import SglangClient
from placement.adapters.vllm import VllmClient
from placement.clock import Clock
from placement.domain import AdapterId, PodId
from placement.errors import EngineError, RetryableEngineError
from placement.metrics import FleetMetrics
from placement.router.adapter_info import AdapterInfo
from placement.router.metrics import RouterMetrics
from placement.router.state import LivePod, Topology, Upstream

log = logging.getLogger("lorafleet.router")

#: The most of a pod's Retry-After a refused load holds its next loads back: a pod that
#: asks for an hour still gets the planned adapter within this long, and other pods
#: take its cold requests meanwhile. As long as a loop's longest backoff
#: (``RouterSettings.loop_backoff_max_s``' default).
MAX_LOAD_HOLD_S = 30.0


class LoadHeldError(RetryableEngineError):
    """A load not sent: the pod's Retry-After holds its loads back. ``first``: the first
    load this hold refused (the one worth a warning; the hold itself was warned of as
    it began). A ``RetryableEngineError`` to everyone else."""

    def __init__(self, message: str, *, pod: str, first: bool) -> None:
        self.first = first
        super().__init__(message, pod=pod)


def load_failure_level(exc: BaseException) -> int:
    """The level to log a failed load at: DEBUG for a hold's refusals after its first,
    WARNING for any other failure."""
    return logging.DEBUG if isinstance(exc, LoadHeldError) and not exc.first else logging.WARNING


def hold_refusal(model: str, held: Mapping[PodId, float]) -> tuple[str, int]:
    """What a 503 says of a request only held pods could serve (``held``: each held
    pod's seconds left), and its Retry-After: the soonest hold's end, whole seconds
    rounded up, at least 1."""
    pods = ", ".join(f"{pod} for {left_s:.1f} s more" for pod, left_s in sorted(held.items()))
    message = (
        f"no pod can load {model} now: the pods that could asked (Retry-After) for no "
        f"load: {pods}; retry later"
    )
    return message, max(1, math.ceil(min(held.values())))


class LoadHost(Protocol):
    """What a load needs of the router (``router.core.Router``): read when each load
    starts (the catalog may change between two)."""

    @property
    def adapters(self) -> AdapterInfo: ...

    @property
    def metrics(self) -> RouterMetrics: ...

    @property
    def fleet_metrics(self) -> FleetMetrics: ...

    @property
    def timer(self) -> Clock: ...

    def engine_client(self, upstream: Upstream) -> VllmClient | SglangClient: ...

    def needs_load(self, state: LivePod, adapter: AdapterId) -> bool: ...


class ColdLoads:
    """The router's loads in flight, each one a task waited on by its requests."""

    def __init__(self, host: LoadHost) -> None:
        self.host = host
        self._tasks: set[asyncio.Task[None]] = set()
        #: Pods that refused a load with a Retry-After: the timer reading before which
        #: no load is sent them. Only waits not yet over are kept.
        self._held_until_s: dict[PodId, float] = {}
        #: Held pods whose hold has refused a load already (later refusals: DEBUG).
        self._refused: set[PodId] = set()

    async def load(self, state: LivePod, adapter: AdapterId) -> None:
        """Load ``adapter`` on the pod once, however many requests wait for it; raise
        what the load ended with (an ``EngineError`` or ``OSError``), or, while the pod's
        Retry-After holds its loads back, a ``RetryableEngineError`` saying so."""
        pending = state.loading.get(adapter)
        if pending is None:
            self._refuse_if_held(state, adapter)
            pending = asyncio.get_running_loop().create_future()
            state.start_loading(adapter, pending)
            self._queue_changed(state)
            load = self._load_once(state, adapter, pending, queued_s=self.host.timer())
            task = asyncio.create_task(load)
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._ended, state, adapter, pending))
        await asyncio.shield(pending)

    def holds(self) -> Mapping[PodId, float]:
        """The pods whose Retry-After holds their loads back now, each with the seconds
        its hold has left by the router's timer (holds that are over are dropped here)."""
        if not self._held_until_s:
            return {}
        now_s = self.host.timer()
        self._prune(now_s)
        return {pod: until_s - now_s for pod, until_s in self._held_until_s.items()}

    def held_for(self, topology: Topology, adapter: AdapterId) -> Mapping[PodId, float]:
        """The held pods of ``adapter``'s pool that a request for it would have to send
        a load, with the seconds each hold has left: healthy pods where the adapter is
        neither listed (``LoadHost.needs_load``: the pod knows its name, wherever it is;
        a vLLM name dropped from the host cache but still listed needs no load either)
        nor loading (its requests wait on that load). A request for a base model sends
        no load."""
        if not self._held_until_s:  # the usual case: nothing to look up
            return {}
        holds = self.holds()
        pool = topology.pool_of(adapter)
        if not holds or pool is None or adapter == pool.served_model:
            return {}
        held: dict[PodId, float] = {}
        for pod, left_s in holds.items():
            state = topology.pods.get(pod)
            if state is None or state.upstream.pool != pool.pool or not state.healthy:
                continue
            if adapter not in state.loading and self.host.needs_load(state, adapter):
                held[pod] = left_s
        return held

    async def cancel(self) -> None:
        """End every load in flight; their waiters hear that it was cancelled."""
        tasks = tuple(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _refuse_if_held(self, state: LivePod, adapter: AdapterId) -> None:
        pod, now_s = state.upstream.pod, self.host.timer()
        self._prune(now_s)
        until_s = self._held_until_s.get(pod)
        if until_s is not None:
            first = pod not in self._refused
            self._refused.add(pod)
            raise LoadHeldError(
                f"loading {adapter} not sent: the pod asked (Retry-After) for no load "
                f"for {until_s - now_s:.1f} s more",
                pod=pod,
                first=first,
            )

    def _prune(self, now_s: float) -> None:
        """Drop the holds that are over by ``now_s``."""
        self._held_until_s = {p: t for p, t in self._held_until_s.items() if t > now_s}
        self._refused &= self._held_until_s.keys()

    def _hold(self, state: LivePod, exc: EngineError | OSError) -> None:
        """After a refusal with a Retry-After: no load to the pod until it is over."""
        wait_s = exc.retry_after_s if isinstance(exc, RetryableEngineError) else None
        if wait_s is None or not wait_s > 0.0:  # NaN is not a wait either
            return
        now_s = self.host.timer()
        until_s = now_s + min(wait_s, MAX_LOAD_HOLD_S)
        pod = state.upstream.pod
        held_s = self._held_until_s.get(pod)
        if held_s is None or held_s <= now_s:
            self._refused.discard(pod)  # a new hold: its first refusal is warned of
        self._held_until_s[pod] = max(until_s, held_s or until_s)
        log.warning(
            "%s asked to wait %.1f s (Retry-After): no load sent it for %.1f s",
            pod,
            wait_s,
            min(wait_s, MAX_LOAD_HOLD_S),
        )

    def _queue_changed(self, state: LivePod) -> None:
        """``lorafleet_load_queue_depth``: the pod's loads waiting or in progress (none
        written for a pod that left the topology while they were)."""
        if self.host.metrics.keeps(state.upstream.pod):
            self.host.fleet_metrics.load_queue_depth(state.upstream.pod, depth=len(state.loading))

    def _ended(
        self,
        state: LivePod,
        adapter: AdapterId,
        done: asyncio.Future[None],
        task: asyncio.Task[None],
    ) -> None:
        """A load task's end, whatever it was: a load that did not settle its waiters
        (cancelled, even before its first step, or ended by an error that is no
        engine's) settles them here, and leaves the pod's loads."""
        self._tasks.discard(task)
        if not done.done():
            pod = state.upstream.pod
            if task.cancelled():
                why = "was cancelled"
            else:
                exc = task.exception()  # retrieved: the waiters hear it, named
                log.error("loading %s on %s failed", adapter, pod, exc_info=exc)
                why = f"failed: {type(exc).__name__}: {exc}"
            done.set_exception(RetryableEngineError(f"loading {adapter} {why}", pod=pod))
            done.exception()  # retrieved here: waiters that gave up must not warn
        if state.loading.get(adapter) is done:  # cancelled before its first step
            state.stop_loading(adapter)
            self._queue_changed(state)

    async def _load_once(
        self, state: LivePod, adapter: AdapterId, done: asyncio.Future[None], *, queued_s: float
    ) -> None:
        host = self.host
        client = host.engine_client(state.upstream)
        try:
            lora_path = host.adapters.source_of(adapter) or host.adapters.sources[adapter]
            started_s = host.timer()
            loaded = await client.load(adapter, lora_path=lora_path)
            # "Already loaded" read nothing: the pod held the weights in host RAM.
            host.metrics.adapter_loaded(
                source="storage" if loaded else "host",
                queued_s=queued_s,
                started_s=started_s,
                finished_s=host.timer(),
            )
            if not loaded and not state.ledger.is_listed(adapter):
                # "Already loaded" of a name we did not know: another router worker (or
                # the controller) loaded it. Its listing tells what else changed.
                state.listing_due = True
            state.ledger.loaded(adapter, lora_path, changed=loaded, busy=state.busy.keys())
            state.sync()
            if loaded and host.metrics.keeps(state.upstream.pod):
                host.metrics.loads.labels(pod=state.upstream.pod, reason="cold").inc()
            done.set_result(None)
        except (EngineError, OSError) as exc:
            self._hold(state, exc)
            done.set_exception(exc)
            done.exception()  # retrieved here: waiters that gave up must not warn
        finally:
            state.stop_loading(adapter)
            self._queue_changed(state)
