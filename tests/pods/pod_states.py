"""Pod states for the reconcile suites, and pods on the engine model that run actions.

Plans come from ``tests.factories.make_plan``. ``engines`` builds one ``PodResidency``
per observed pod holding what the state says; ``run`` drives actions through them as
the engine clients do (SGLang's client unloads and loads again for ``inplace``), and
``observe`` reads them back as ``apply.observe`` does, with the executor's ``Ledger``
(each pod's engine model).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from placement.actuation.ledger import Ledger, SavedPod
from placement.actuation.reconcile_pods import PodState
from placement.domain import Action, ActionKind, AdapterId, PodId
from placement.residency import Effects, EngineModel, PodResidency

VLLM, SGLANG, SGLANG_HARD_CAP = EngineModel.VLLM, EngineModel.SGLANG, EngineModel.SGLANG_HARD_CAP


def ids(names: Iterable[str]) -> tuple[AdapterId, ...]:
    return tuple(AdapterId(name) for name in names)


def path_of(adapter: str, version: int = 1) -> str:
    return f"s3://adapters/v{version}/{adapter}"


def state(
    registered: Iterable[str],
    *,
    cpu: int,
    gpu: int = 1,
    warmed: Iterable[str] | None = None,
    pinned: Iterable[str] = (),
    engine: EngineModel = VLLM,
    paths: Mapping[str, str] | None = None,
) -> PodState:
    names = ids(registered)
    listed = {a: path_of(a) for a in names} | dict(paths or {})
    return PodState(
        registered=frozenset(names),
        engine=engine,
        max_cpu_loras=cpu,
        max_loras=gpu,
        warmed=None if warmed is None else ids(warmed),
        pinned=frozenset(ids(pinned)),
        paths=MappingProxyType({AdapterId(a): p for a, p in listed.items() if a in names}),
    )


def engines(observed: Mapping[PodId, PodState]) -> dict[PodId, PodResidency]:
    """Pods on the engine model holding what ``observed`` says: the registered adapters
    nobody warmed loaded first, then the ledger's activations in order (a name in the
    ledger that the pod does not list is loaded, then unloaded: a vLLM ghost)."""
    pods = {}
    for pod_id, s in observed.items():
        pod = PodResidency(s.engine, max_loras=s.max_loras, max_cpu_loras=s.max_cpu_loras)
        order = list(s.warmed or ())
        for adapter in sorted(s.registered - set(order)) + order:
            if adapter not in pod.listed:
                path = s.paths.get(adapter, path_of(adapter))
                pod.load(adapter, path, pinned=adapter in s.pinned)
            if s.engine.is_sglang:
                pod.request(adapter)
        for ghost in set(order) - s.registered:
            pod.unload(ghost)
        pods[pod_id] = pod
    return pods


def call(pod: PodResidency, action: Action, *, sources: Mapping[AdapterId, str]) -> Effects:
    """One action on one engine, as the engine clients send it."""
    if action.kind is ActionKind.UNLOAD:
        return pod.unload(action.adapter)
    if action.kind is ActionKind.WARMUP:
        return pod.request(action.adapter)
    path = sources.get(action.adapter, path_of(action.adapter))
    if action.inplace and pod.engine.is_sglang:
        pod.unload(action.adapter)
        return pod.load(action.adapter, path, pinned=action.pinned)
    return pod.load(action.adapter, path, pinned=action.pinned, inplace=action.inplace)


def run(
    pods: Mapping[PodId, PodResidency],
    actions: Iterable[Action],
    *,
    sources: Mapping[AdapterId, str] | None = None,
    ledger: Ledger | None = None,
) -> Iterator[tuple[Action, Effects]]:
    """Run ``actions`` in order, yielding after each what it did (the pods are live)."""
    for action in actions:
        effects = call(pods[action.pod], action, sources=sources or {})
        if ledger is not None:
            ledger.record(action)
        yield action, effects


def ledger_of(observed: Mapping[PodId, PodState]) -> Ledger | None:
    """The executor's ledger as ``observed`` reads it (each pod's engine model holding
    what ``engines`` puts on the pod, built again from its saved form, and the pins);
    None when no pod has one."""
    if all(s.warmed is None for s in observed.values()):
        return None
    ledger = Ledger()
    for pod_id, model in engines(observed).items():
        ledger.pods[pod_id] = SavedPod.of(model).build()
        ledger.pinned[pod_id] = set(observed[pod_id].pinned)
    return ledger


def observe(
    pods: Mapping[PodId, PodResidency],
    observed: Mapping[PodId, PodState],
    ledger: Ledger | None,
) -> dict[PodId, PodState]:
    """The pods read back as ``apply.observe`` reads them: listings and the ledger."""
    states = {}
    for pod_id, pod in pods.items():
        names = frozenset(ids(pod.listed))
        before = observed[pod_id]
        warmed = None
        pinned = before.pinned & names
        if ledger is not None:
            ledger.observe(
                pod_id,
                listed={AdapterId(a): p for a, p in pod.listed.items()},
                engine=pod.engine,
                max_loras=before.max_loras,
                max_cpu_loras=before.max_cpu_loras,
            )
            warmed = ledger.gpu_order(pod_id)
            pinned |= ledger.pins(pod_id) & names
        states[pod_id] = PodState(
            registered=names,
            engine=pod.engine,
            max_cpu_loras=before.max_cpu_loras,
            max_loras=before.max_loras,
            warmed=warmed,
            pinned=frozenset(pinned),
            paths=MappingProxyType({AdapterId(a): p for a, p in pod.listed.items()}),
        )
    return states


@dataclass(frozen=True)
class Held:
    """What one engine holds, as sets: what a second apply must leave alone."""

    listed: frozenset[tuple[str, str]]
    gpu: frozenset[str]
    host: frozenset[str]
    ghosts: int


def held(pod: PodResidency) -> Held:
    return Held(
        listed=frozenset(pod.listed.items()),
        gpu=frozenset(pod.on_gpu()),
        host=frozenset(pod.in_host()),
        ghosts=pod.ghosts_on_gpu(),
    )
