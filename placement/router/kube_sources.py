"""The router's plan and pods from Kubernetes: the plan ConfigMap and a label selector.

Adapts the cluster ports (``placement.ports.PlanStore`` and ``PodDiscovery``, whose
real implementations are in ``placement.adapters.kube`` and in-memory twins in
``placement.adapters.kube_memory``) to the router's ``PlanSource`` and ``PodSource``.
Both ports are blocking, so each call runs in a worker thread.

A discovered pod's pool comes from its ``lorafleet.io/pool`` label. The pool's engine,
served model name and slot counts come from a fleet file when one is given (its pool
of the same name: the slot counts of its pod of the same name, else of its first pod),
else from the pod's labels below, else from defaults (vLLM, the pool's name, 1 GPU
slot, a host cache of max-loras).

A label that is there but cannot be read is never taken for a default: the pod is left
out, with a warning (once per pod and what was wrong, then at DEBUG at each poll while
it stays so) naming the pod, each bad label, its value and what is accepted, as
``placement.adapters.kube`` leaves out a pod without a name or a pool; the rest of the
discovery goes on. That holds for an engine the
router does not speak (guessed as vLLM, the pod would be scraped and sent requests in a
dialect it may not speak), an empty served model, and slot counts that are not a whole
number in digits (``four``, ``-1``, ``1e3``), below 1, or a ``max-cpu-loras`` below
``max-loras`` (both engines refuse to start so: vLLM's ``--max-cpu-loras``, SGLang's
``--max-loaded-loras``). Left out rather than guessed because the router's ledger
models each pod's GPU slots and host cache from these counts: with a wrong count it
believes adapters hot that the engine has pushed off, or leaves slots unused, and
nobody is told. A pod out of the selection takes no traffic from this router until its
labels are fixed, and the warning says which to fix.
"""

from __future__ import annotations

import asyncio
import logging
import re

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


#: A slot count as a label value: decimal digits only (no sign, exponent or point).
_WHOLE = re.compile(r"[0-9]+")
#: Why a host cache below the GPU slots is refused.
_ENGINES_REFUSE = (
    "vLLM refuses a --max-cpu-loras below --max-loras, SGLang a --max-loaded-loras below "
    "--max-loras-per-batch"
)


def _count(
    pod: DiscoveredPod, label: str, *, default: int, floor: int, problems: list[Problem]
) -> int:
    """The label's count; ``default`` without the label, or with a bad value, whose
    problem (the value and what is accepted) is added to ``problems``. ``floor`` above
    1 is the pod's max-loras, the least a host cache may hold."""
    value = pod.labels.get(label)
    if value is None:
        return default
    whole = _WHOLE.fullmatch(value) is not None
    if whole and int(value) >= floor:
        return int(value)
    if floor == 1:
        accepted = "a whole number of at least 1, in decimal digits"
        message = f"{value!r} is not a slot count (accepted: {accepted})"
    else:
        accepted = f"a whole number of at least {floor}, the pod's {MAX_LORAS_LABEL}"
        if whole:
            message = f"{value!r} is below {MAX_LORAS_LABEL}, {floor}: {_ENGINES_REFUSE}"
        else:
            message = f"{value!r} is not a slot count"
        message += f" (accepted: {accepted}, in decimal digits)"
    problems.append(Problem(source=f"pod {pod.name}", field=f"label {label}", message=message))
    return default


def slots_of(pod: DiscoveredPod) -> tuple[int, int]:
    """The pod's GPU slots and host-cache size from its ``lorafleet.io/max-loras`` and
    ``lorafleet.io/max-cpu-loras`` labels (1, and max-loras, without them); an
    InputError naming the pod, each bad label, its value and what is accepted. A bad
    max-loras leaves max-cpu-loras checked against 1 only."""
    problems: list[Problem] = []
    max_loras = _count(pod, MAX_LORAS_LABEL, default=1, floor=1, problems=problems)
    max_cpu_loras = _count(
        pod, MAX_CPU_LORAS_LABEL, default=max_loras, floor=max_loras, problems=problems
    )
    if problems:
        raise InputError(problems)
    return max_loras, max_cpu_loras


def served_model_of(pod: DiscoveredPod) -> str:
    """The model name the pod's ``lorafleet.io/served-model`` label names (its pool's
    name without one); an InputError naming the pod and the label if it is empty."""
    value = pod.labels.get(SERVED_MODEL_LABEL, str(pod.pool))
    if not value:
        message = "'' names no model (accepted: the base model's name as the pod serves it)"
        problem = Problem(
            source=f"pod {pod.name}", field=f"label {SERVED_MODEL_LABEL}", message=message
        )
        raise InputError([problem])
    return value


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
                told[pod.name] = why = "; ".join(str(problem) for problem in exc.problems)
                # Once at WARNING while the reason stays; each later poll at DEBUG.
                level = logging.DEBUG if self._told.get(pod.name) == why else logging.WARNING
                log.log(level, "%s: %s; left out", self._description, why)
        self._told = told
        return tuple(upstreams)

    def _upstream(self, pod: DiscoveredPod) -> Upstream:
        pool = self._pools.get(PoolId(pod.pool))
        if pool is not None:
            # The fleet file's pod of the same name when it lists one (a StatefulSet's
            # pods keep their names): a pod may set its own max_loras over the pool's.
            named = {fleet_pod.name: fleet_pod for fleet_pod in pool.pods}
            template = named.get(pod.name) or next(iter(pool.pods), None)
            return Upstream(
                pod=pod.name,
                pool=pod.pool,
                url=pod.url,
                engine=pool.engine,
                served_model=pool.served_model_name,
                max_loras=template.max_loras if template else 1,
                max_cpu_loras=template.max_cpu_loras if template else 1,
            )
        return _from_labels(pod)


def _from_labels(pod: DiscoveredPod) -> Upstream:
    """The pod as its labels describe it; an InputError naming every bad label."""
    problems: list[Problem] = []
    try:
        engine = engine_of(pod)
    except InputError as exc:
        problems += exc.problems
    try:
        served_model = served_model_of(pod)
    except InputError as exc:
        problems += exc.problems
    try:
        max_loras, max_cpu_loras = slots_of(pod)
    except InputError as exc:
        problems += exc.problems
    if problems:
        raise InputError(problems)
    return Upstream(
        pod=pod.name,
        pool=pod.pool,
        url=pod.url,
        engine=engine,
        served_model=served_model,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
    )
