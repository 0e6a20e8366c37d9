"""The router's plan and pods from Kubernetes: the plan ConfigMap and a label selector.

Adapts the cluster ports (``placement.ports.PlanStore`` and ``PodDiscovery``, whose
real implementations are in ``placement.adapters.kube`` and in-memory twins in
``placement.adapters.kube_memory``) to the router's ``PlanSource`` and ``PodSource``.
Both ports are blocking, so each call runs in a worker thread.

A discovered pod's pool comes from its ``lorafleet.io/pool`` label. The pool's engine,
served model name and slot counts come from a fleet file when one is given (its pool
of the same name), else from the pod's labels below, else from defaults. A pod whose
``lorafleet.io/engine`` label names no engine the router speaks is left out with a
warning (once per pod and value) naming the pod, the label, its value and the accepted
values, as ``placement.adapters.kube`` leaves out a pod without a name or a pool: the
rest of the discovery goes on. Guessed as vLLM it would be scraped and sent requests in
a dialect it may not speak.
"""

from __future__ import annotations

import asyncio
import logging

from placement.domain import Engine, Fleet, PodId, PoolId
from placement.errors import InputError, KubeError, PlanError, Problem
from placement.plan import Plan, plan_to_json
from placement.ports import DiscoveredPod, PlanStore, PodDiscovery
from placement.router.state import Upstream

ENGINE_LABEL = "lorafleet.io/engine"
SERVED_MODEL_LABEL = "lorafleet.io/served-model"
MAX_LORAS_LABEL = "lorafleet.io/max-loras"
MAX_CPU_LORAS_LABEL = "lorafleet.io/max-cpu-loras"

log = logging.getLogger("lorafleet.router")


class StorePlanSource:
    """The current plan of a ``PlanStore`` (the controller's ConfigMap)."""

    def __init__(self, store: PlanStore, *, description: str = "plan configmap") -> None:
        self._store = store
        self._description = description
        self._last: str | None = None

    @property
    def description(self) -> str:
        return self._description

    async def poll(self) -> Plan | None:
        try:
            plan = await asyncio.to_thread(self._store.current)
        except KubeError as exc:
            raise PlanError(f"{self._description}: {exc}") from None
        if plan is None:
            raise PlanError(f"{self._description} holds no plan yet")
        text = plan_to_json(plan)
        if text == self._last:
            return None
        self._last = text
        return plan


def engine_of(pod: DiscoveredPod) -> Engine:
    """The engine the pod's ``lorafleet.io/engine`` label names (vLLM without one); an
    InputError naming the pod, the label, its value and the accepted values if none."""
    value = pod.labels.get(ENGINE_LABEL, Engine.VLLM.value)
    try:
        return Engine(value)
    except ValueError:
        accepted = ", ".join(engine.value for engine in Engine)
        problem = Problem(
            source=f"pod {pod.name}",
            field=f"label {ENGINE_LABEL}",
            message=f"{value!r} is not an engine the router speaks (accepted: {accepted})",
        )
        raise InputError([problem]) from None


def _label_int(pod: DiscoveredPod, label: str, default: int) -> int:
    value = pod.labels.get(label, "")
    return int(value) if value.isascii() and value.isdigit() else default


class DiscoveryPodSource:
    """Ready pods matching the selector, described by the fleet file or their labels."""

    def __init__(
        self, discovery: PodDiscovery, *, fleet: Fleet | None = None, description: str = "selector"
    ) -> None:
        self._discovery = discovery
        self._pools = {pool.name: pool for pool in fleet.pools} if fleet is not None else {}
        self._description = description
        #: The pods left out for their labels, with what was said: said again only when
        #: it changes, or after the pod came right or left.
        self._told: dict[PodId, str] = {}

    @property
    def description(self) -> str:
        return self._description

    async def upstreams(self) -> tuple[Upstream, ...]:
        pods = await asyncio.to_thread(self._discovery.list_pods)
        upstreams = []
        told: dict[PodId, str] = {}
        for pod in pods:
            try:
                upstreams.append(self._upstream(pod))
            except InputError as exc:
                told[pod.name] = why = str(exc)
                if self._told.get(pod.name) != why:
                    log.warning("%s: %s; left out", self._description, why)
        self._told = told
        return tuple(upstreams)

    def _upstream(self, pod: DiscoveredPod) -> Upstream:
        pool = self._pools.get(PoolId(pod.pool))
        if pool is not None:
            template = next(iter(pool.pods), None)
            return Upstream(
                pod=pod.name,
                pool=pod.pool,
                url=pod.url,
                engine=pool.engine,
                served_model=pool.served_model_name,
                max_loras=template.max_loras if template else 1,
                max_cpu_loras=template.max_cpu_loras if template else 1,
            )
        max_loras = _label_int(pod, MAX_LORAS_LABEL, 1)
        return Upstream(
            pod=pod.name,
            pool=pod.pool,
            url=pod.url,
            engine=engine_of(pod),
            served_model=pod.labels.get(SERVED_MODEL_LABEL, str(pod.pool)),
            max_loras=max_loras,
            max_cpu_loras=_label_int(pod, MAX_CPU_LORAS_LABEL, max_loras),
        )
