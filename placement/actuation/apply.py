"""Apply a plan to the pods: observe them, reconcile, execute. The IO shell of reconcile.

``apply_plan`` is what ``lorafleet apply`` and the controller call: it lists each pod's
registrations and their paths (``/v1/models``) through the ``EngineClient`` port, builds
the observed state with the pod's engine (``engine_model``), the ledger (each pod's
engine model, corrected from the listing first: its GPU order is what reconcile
replays) and the catalog's pins, asks the pure ``reconcile`` for actions (with the
catalog's sources, so a changed ``source`` is loaded in place) and runs them with the
``Executor``, which applies each action that succeeds to the ledger. A pod
that does not answer is reported as unreachable and left alone (reconcile then keeps
its adapters' other replicas).

A listing that fails retryably (a 5xx, 429, refused connection, timeout) is tried up to
``LIST_ATTEMPTS`` times, waiting between tries as the executor's retries do:
``backoff_s`` under the ``ExecutorSettings`` in force, at least the pod's
``Retry-After`` (capped at ``backoff_max_s``), with the same ``sleep`` and ``rng`` the
executor is given. Each pod waits on its own; the others are listed meanwhile. With
``retry_timeouts=False`` (every listing of the controller's: ``EngineActuator.apply``
for the plan and watchdog ticks, ``EngineActuator.registered`` for the preload and
watchdog ticks) a timeout is not retried: all pods are listed together, and the plan
tick lists while it holds the controller's one actuation lock, so a hung pod's three
timeouts would hold every other pod's work, the webhook's preloads too, that long. An
unreachable pod's report is its last error's text and how many tries were made.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import httpx

from placement.actuation.executor import (
    ActionResult,
    ApplyReport,
    Executor,
    Ledger,
    Sleep,
    backoff_s,
)
from placement.actuation.reconcile import ActionSchedule, schedule
from placement.actuation.reconcile_pods import PodState
from placement.adapters.engines import engine_client
from placement.domain import Action, AdapterId, Catalog, Fleet, PodId
from placement.errors import EngineError, EngineTimeoutError, RetryableEngineError
from placement.plan import Plan
from placement.ports import EngineClient, Registered
from placement.residency import engine_model
from placement.settings import ExecutorSettings

#: Tries at listing a pod before calling it unreachable (a lone 5xx is not a dead pod);
#: the waits between them are the executor's backoff (``backoff_s``).
LIST_ATTEMPTS = 3


@dataclass(frozen=True, kw_only=True)
class Observation:
    states: Mapping[PodId, PodState]
    #: Pods that could not be listed, with why.
    unreachable: Mapping[PodId, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True)
class ApplyOutcome:
    observation: Observation
    actions: tuple[Action, ...]
    report: ApplyReport


def make_clients(
    fleet: Fleet, *, http: httpx.AsyncClient, timeout_s: float = 30.0
) -> dict[PodId, EngineClient]:
    """One engine client per pod, all sharing ``http`` (and its connection pool)."""
    return {
        pod.name: engine_client(
            pod, served_model_name=pool.served_model_name, http=http, timeout_s=timeout_s
        )
        for pool in fleet.pools
        for pod in pool.pods
    }


def lora_paths(catalog: Catalog) -> dict[AdapterId, str]:
    """Each adapter's ``source``, handed to the engine as ``lora_path``."""
    return {adapter.name: adapter.source for adapter in catalog.adapters}


def _catalog_pins(catalog: Catalog | None, pod: PodId) -> frozenset[AdapterId]:
    if catalog is None:
        return frozenset()
    return frozenset(a.name for a in catalog.adapters if a.pinned or pod in a.pinned_pods)


def _attempts(count: int) -> str:
    return f"after {count} attempt{'' if count == 1 else 's'}"


async def _listing(
    client: EngineClient,
    *,
    settings: ExecutorSettings,
    rng: random.Random,
    sleep: Sleep,
    retry_timeouts: bool = True,
) -> Registered | str:
    """One pod's listing, or why it could not be had (the last error, and the tries).

    A retryable failure waits ``backoff_s`` (at least the pod's Retry-After, capped)
    before the next of ``LIST_ATTEMPTS`` tries; a permanent one is not retried, nor a
    timeout without ``retry_timeouts``."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await client.registered()
        except RetryableEngineError as exc:
            if not retry_timeouts and isinstance(exc, EngineTimeoutError):
                return f"{exc} ({_attempts(attempt)}; a timeout is not retried here)"
            if attempt >= LIST_ATTEMPTS:
                return f"{exc} ({_attempts(attempt)})"
            delay_s = backoff_s(
                attempt, settings=settings, rng=rng, retry_after_s=exc.retry_after_s
            )
        except EngineError as exc:
            return f"{exc} ({_attempts(attempt)}; not retryable)"
        await sleep(delay_s)


async def observe(
    fleet: Fleet,
    clients: Mapping[PodId, EngineClient],
    *,
    catalog: Catalog | None = None,
    ledger: Ledger | None = None,
    settings: ExecutorSettings | None = None,
    rng: random.Random | None = None,
    sleep: Sleep = asyncio.sleep,
    retry_timeouts: bool = True,
) -> Observation:
    """List every pod's registrations at once; a pod that fails is unreachable.

    ``settings``, ``rng`` and ``sleep`` time the retries of a failed listing, as they
    do the executor's (pass the executor's own); by default ``ExecutorSettings()``,
    a fresh ``random.Random()`` and the real ``asyncio.sleep``. ``retry_timeouts=False``:
    a pod that timed out is unreachable after that one try (the others are waited on
    no longer than the client's timeout for it)."""
    pods = fleet.pods
    retry_settings = settings if settings is not None else ExecutorSettings()
    jitter = rng if rng is not None else random.Random()

    async def listed(pod_id: PodId) -> Registered | str:
        client = clients.get(pod_id)
        if client is None:
            return "no client for this pod"
        return await _listing(
            client,
            settings=retry_settings,
            rng=jitter,
            sleep=sleep,
            retry_timeouts=retry_timeouts,
        )

    answers = await asyncio.gather(*(listed(pod.name) for pod in pods))
    states: dict[PodId, PodState] = {}
    unreachable: dict[PodId, str] = {}
    for pod, answer in zip(pods, answers, strict=True):
        if isinstance(answer, str):
            unreachable[pod.name] = answer
            continue
        names, engine = answer.names(), engine_model(pod.engine)
        pinned = _catalog_pins(catalog, pod.name) & names
        warmed = None
        if ledger is not None:
            ledger.observe(
                pod.name,
                listed=answer.adapters,
                engine=engine,
                max_loras=pod.max_loras,
                max_cpu_loras=pod.max_cpu_loras,
            )
            pinned |= ledger.pins(pod.name) & names
            warmed = ledger.gpu_order(pod.name)
        states[pod.name] = PodState(
            registered=names,
            engine=engine,
            max_cpu_loras=pod.max_cpu_loras,
            max_loras=pod.max_loras,
            warmed=warmed,
            pinned=frozenset(pinned),
            paths=MappingProxyType(dict(answer.adapters)),
        )
    return Observation(states=MappingProxyType(states), unreachable=MappingProxyType(unreachable))


async def plan_actions(
    plan: Plan,
    *,
    fleet: Fleet,
    clients: Mapping[PodId, EngineClient],
    catalog: Catalog | None = None,
    ledger: Ledger | None = None,
    demand_rps: Mapping[AdapterId, float] | None = None,
    settings: ExecutorSettings | None = None,
    rng: random.Random | None = None,
    sleep: Sleep = asyncio.sleep,
    retry_timeouts: bool = True,
) -> tuple[Observation, ActionSchedule]:
    """What applying ``plan`` would do now (``--dry-run``), in the order it needs.
    ``demand_rps`` (the forecast) orders each hot set, the most valuable activated last;
    ``settings``, ``rng``, ``sleep`` and ``retry_timeouts`` rule the listing's retries
    (``observe``)."""
    observation = await observe(
        fleet,
        clients,
        catalog=catalog,
        ledger=ledger,
        settings=settings,
        rng=rng,
        sleep=sleep,
        retry_timeouts=retry_timeouts,
    )
    sources = lora_paths(catalog) if catalog is not None else None
    steps = schedule(plan, observation.states, sources=sources, demand_rps=demand_rps)
    return observation, steps


async def apply_plan(
    plan: Plan,
    *,
    fleet: Fleet,
    catalog: Catalog,
    clients: Mapping[PodId, EngineClient],
    settings: ExecutorSettings,
    rng: random.Random,
    ledger: Ledger | None = None,
    sleep: Sleep = asyncio.sleep,
    demand_rps: Mapping[AdapterId, float] | None = None,
    on_actions: Callable[[tuple[Action, ...]], None] | None = None,
    on_result: Callable[[ActionResult], None] | None = None,
    retry_timeouts: bool = True,
) -> ApplyOutcome:
    """Observe, reconcile and execute once. Applying the same plan again loads nothing.
    The listing's retries and the actions' share ``settings``, ``rng`` and ``sleep``;
    ``retry_timeouts=False`` lists a pod that timed out once (``observe``)."""
    observation, steps = await plan_actions(
        plan,
        fleet=fleet,
        clients=clients,
        catalog=catalog,
        ledger=ledger,
        demand_rps=demand_rps,
        settings=settings,
        rng=rng,
        sleep=sleep,
        retry_timeouts=retry_timeouts,
    )
    if on_actions is not None:
        on_actions(steps.actions)
    executor = Executor(
        clients,
        lora_paths=lora_paths(catalog),
        settings=settings,
        rng=rng,
        sleep=sleep,
        ledger=ledger,
        on_result=on_result,
    )
    report = await executor.run(steps.actions, after=steps.after)
    return ApplyOutcome(observation=observation, actions=steps.actions, report=report)


def unreachable_lines(observation: Observation) -> Iterable[str]:
    return (f"{pod}: unreachable: {why}" for pod, why in sorted(observation.unreachable.items()))
