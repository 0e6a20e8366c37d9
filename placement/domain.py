"""Domain values of lorafleet: adapters, pods, pools, pipelines and the actions on pods.

Everything here is a frozen, keyword-only dataclass, a ``NewType`` id or an ``Enum``.
Values are built once at the edge (``placement.inputs``) and trusted afterwards; this
module does no IO and no validation beyond what a constructor can check cheaply.
"""

from __future__ import annotations

import copyreg
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NewType


def _read_only(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


def _reduce_read_only(
    mapping: MappingProxyType[Any, Any],
) -> tuple[Callable[[dict[Any, Any]], MappingProxyType[Any, Any]], tuple[dict[Any, Any]]]:
    return (_read_only, (dict(mapping),))


#: Values here hold read-only mappings (``MappingProxyType``), which pickle cannot copy by
#: itself; this lets them cross to other processes (the capacity grid's workers) and come
#: back read-only.
copyreg.pickle(MappingProxyType, _reduce_read_only)


AdapterId = NewType("AdapterId", str)
PodId = NewType("PodId", str)
PoolId = NewType("PoolId", str)
TenantId = NewType("TenantId", str)

#: The ranks vLLM accepts for ``--max-lora-rank`` (vllm/config/lora.py).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

#: The projections a LoRA adapter may target, in the order the sizing reports them.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Tier(enum.StrEnum):
    """Where an adapter lives on a pod: on a GPU slot, in host RAM, or nowhere."""

    HOT = "hot"
    WARM = "warm"
    COLD = "cold"


class Engine(enum.StrEnum):
    """The serving engine a pool runs; it decides the HTTP dialect (POD-API.md)."""

    VLLM = "vllm"
    SGLANG = "sglang"


class Outcome(enum.StrEnum):
    """How a request found its adapter when it was admitted."""

    GPU_HIT = "gpu_hit"
    CPU_HIT = "cpu_hit"
    COLD_LOAD = "cold_load"


@dataclass(frozen=True, kw_only=True)
class ModelDims:
    """The dimensions of a base model that decide the size of a LoRA adapter on it."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int

    def projection_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of one projection matrix in one layer."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden_size, q_out),
            "k_proj": (self.hidden_size, kv_out),
            "v_proj": (self.hidden_size, kv_out),
            "o_proj": (q_out, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }
        return shapes[module]


class AdapterClass(enum.StrEnum):
    """What an adapter serves (catalog ``class``): when GPU slots are short, production
    adapters keep them before batch ones, and batch ones before experiments."""

    PRODUCTION = "production"
    BATCH = "batch"
    EXPERIMENT = "experiment"

    @property
    def weight(self) -> float:
        """The share of the delay a hot replica saves that the solver counts for it."""
        return {"production": 1.0, "batch": 0.5, "experiment": 0.1}[self.value]


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """One LoRA adapter of the catalog, with its size already resolved."""

    name: AdapterId
    base_model: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    dtype: str
    source: str
    size_bytes: int
    tenant: TenantId | None = None
    timezone: str | None = None
    pinned: bool = False
    pinned_pods: tuple[PodId, ...] = ()
    min_replicas: int = 1
    max_replicas: int = 4
    slo_ttft_ms: float | None = None
    group: str | None = None
    adapter_class: AdapterClass = AdapterClass.PRODUCTION

    @property
    def is_pinned(self) -> bool:
        return self.pinned or bool(self.pinned_pods)


@dataclass(frozen=True, kw_only=True)
class Pod:
    """One serving replica: its address, its engine limits and its adapter budgets."""

    name: PodId
    pool: PoolId
    url: str
    engine: Engine
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    hbm_adapter_bytes: int
    host_adapter_bytes: int
    capacity_rps: float
    zone: str | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True)
class AdapterStorage:
    """Where a pool's pods read adapters from on a cold load (fleet.yaml ``storage:``):
    local NVMe, a network volume or object storage, at this bandwidth after this wait
    for the first byte."""

    kind: str
    bytes_per_s: float
    first_byte_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Pool:
    """Pods serving one base model with one engine."""

    name: PoolId
    base_model: str
    served_model_name: str
    engine: Engine
    max_lora_rank: int
    dims: ModelDims
    pods: tuple[Pod, ...]
    #: None: the load-cost settings' storage bandwidth (local NVMe).
    storage: AdapterStorage | None = None


@dataclass(frozen=True, kw_only=True)
class Catalog:
    """All adapters, in the order the catalog lists them."""

    adapters: tuple[Adapter, ...]

    def by_name(self) -> dict[AdapterId, Adapter]:
        return {adapter.name: adapter for adapter in self.adapters}

    def names(self) -> frozenset[AdapterId]:
        return frozenset(adapter.name for adapter in self.adapters)


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """All pools and their pods."""

    pools: tuple[Pool, ...]

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(pod for pool in self.pools for pod in pool.pods)

    def pod_by_name(self) -> dict[PodId, Pod]:
        return {pod.name: pod for pod in self.pods}

    def pool_by_name(self) -> dict[PoolId, Pool]:
        return {pool.name: pool for pool in self.pools}

    def pool_for_base(self, base_model: str) -> Pool | None:
        return next((pool for pool in self.pools if pool.base_model == base_model), None)


@dataclass(frozen=True, kw_only=True)
class PipelineStep:
    """An adapter a trigger leads to, with the chance and the delay it follows in."""

    adapter: AdapterId
    probability: float = 1.0
    within_s: float = 0.0
    after: AdapterId | None = None


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """A named event (``document.uploaded``) and the adapters it leads to."""

    trigger: str
    steps: tuple[PipelineStep, ...]


@dataclass(frozen=True, kw_only=True)
class Pipelines:
    """Pipeline triggers and the adapters each tenant's login leads to."""

    pipelines: tuple[Pipeline, ...] = ()
    logins: Mapping[TenantId, tuple[AdapterId, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def by_trigger(self) -> dict[str, Pipeline]:
        return {pipeline.trigger: pipeline for pipeline in self.pipelines}


class ActionKind(enum.StrEnum):
    LOAD = "load"
    UNLOAD = "unload"
    WARMUP = "warmup"


@dataclass(frozen=True, kw_only=True)
class Action:
    """One change to push to one pod. ``Load`` registers, ``Warmup`` activates on the GPU."""

    kind: ActionKind
    pod: PodId
    adapter: AdapterId
    reason: str
    pinned: bool = False
    #: A load of new weights under a name the pod lists already (its ``source`` changed):
    #: vLLM's ``load_inplace``; SGLang's client unloads and loads again.
    inplace: bool = False

    def describe(self) -> str:
        return f"{self.kind.value} {self.adapter} on {self.pod}: {self.reason}"


def Load(  # noqa: N802
    *, pod: PodId, adapter: AdapterId, reason: str, pinned: bool = False, inplace: bool = False
) -> Action:
    return Action(
        kind=ActionKind.LOAD,
        pod=pod,
        adapter=adapter,
        reason=reason,
        pinned=pinned,
        inplace=inplace,
    )


def Unload(*, pod: PodId, adapter: AdapterId, reason: str) -> Action:  # noqa: N802
    return Action(kind=ActionKind.UNLOAD, pod=pod, adapter=adapter, reason=reason)


def Warmup(*, pod: PodId, adapter: AdapterId, reason: str) -> Action:  # noqa: N802
    return Action(kind=ActionKind.WARMUP, pod=pod, adapter=adapter, reason=reason)
