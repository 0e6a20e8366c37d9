"""Helpers shared by the controller tests: a fake clock and small plans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from placement.domain import (
    Adapter,
    AdapterId,
    Catalog,
    Engine,
    Fleet,
    ModelDims,
    Pipeline,
    Pipelines,
    PipelineStep,
    Pod,
    PodId,
    Pool,
    PoolId,
    TenantId,
    Tier,
)
from placement.plan import AdapterPlan, Plan, PodPlan

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


class FakeClock:
    """Seconds that move only when a test moves them; jumps either way allowed."""

    def __init__(self, start_s: float = T0.timestamp()) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def wall(self) -> datetime:
        return datetime.fromtimestamp(self.now_s, UTC)


def make_plan(
    plan_id: str = "p1",
    *,
    hot: dict[str, tuple[str, ...]] | None = None,
    created: datetime = T0,
) -> Plan:
    """A small plan: per pod its hot adapters, each adapter hot on the pods listing it."""
    hot = hot if hot is not None else {"pod-0": ("a1", "a2"), "pod-1": ("a2",)}
    pods = {
        PodId(pod): PodPlan(hot=tuple(AdapterId(a) for a in names)) for pod, names in hot.items()
    }
    holders: dict[str, list[str]] = {}
    for pod, names in hot.items():
        for name in names:
            holders.setdefault(name, []).append(pod)
    adapters = {
        AdapterId(name): AdapterPlan(
            tier=Tier.HOT,
            pods=MappingProxyType({PodId(p): 1.0 / len(owners) for p in owners}),
        )
        for name, owners in holders.items()
    }
    return Plan(
        id=plan_id,
        created_at=created,
        valid_from=created,
        valid_until=created + timedelta(hours=1),
        pods=MappingProxyType(pods),
        adapters=MappingProxyType(adapters),
    )


def make_adapter(
    name: str,
    *,
    tenant: str | None = None,
    group: str | None = None,
    pinned: bool = False,
    base_model: str = "llama-3.1-8b",
) -> Adapter:
    return Adapter(
        name=AdapterId(name),
        base_model=base_model,
        rank=16,
        alpha=16.0,
        target_modules=("q_proj", "v_proj"),
        dtype="float16",
        source=f"/adapters/{name}",
        size_bytes=50_000_000,
        tenant=TenantId(tenant) if tenant else None,
        pinned=pinned,
        group=group,
    )


def make_catalog(*adapters: Adapter) -> Catalog:
    return Catalog(adapters=adapters)


def make_fleet(pods: int = 2, *, max_loras: int = 2, urls: tuple[str, ...] = ()) -> Fleet:
    dims = ModelDims(
        name="llama-3.1-8b",
        hidden_size=4096,
        num_layers=32,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
    )
    pod_list = tuple(
        Pod(
            name=PodId(f"pod-{i}"),
            pool=PoolId("llama"),
            url=urls[i] if i < len(urls) else f"http://127.0.0.1:{18000 + i}",
            engine=Engine.VLLM,
            max_loras=max_loras,
            max_cpu_loras=4 * max_loras,
            max_lora_rank=64,
            hbm_adapter_bytes=2_000_000_000,
            host_adapter_bytes=16_000_000_000,
            capacity_rps=10.0,
        )
        for i in range(pods)
    )
    pool = Pool(
        name=PoolId("llama"),
        base_model="llama-3.1-8b",
        served_model_name="llama",
        engine=Engine.VLLM,
        max_lora_rank=64,
        dims=dims,
        pods=pod_list,
    )
    return Fleet(pools=(pool,))


def doc_pipelines() -> Pipelines:
    steps = (
        PipelineStep(adapter=AdapterId("doc-classifier"), probability=1.0),
        PipelineStep(adapter=AdapterId("legal-extract"), probability=0.6, within_s=120),
        PipelineStep(adapter=AdapterId("medical-extract"), probability=0.4, within_s=120),
    )
    return Pipelines(
        pipelines=(Pipeline(trigger="document.uploaded", steps=steps),),
        logins=MappingProxyType({TenantId("acme"): (AdapterId("acme-chat"),)}),
    )


def doc_catalog() -> Catalog:
    return make_catalog(
        make_adapter("doc-classifier", group="docs"),
        make_adapter("legal-extract", group="docs"),
        make_adapter("medical-extract", group="docs"),
        make_adapter("acme-chat", tenant="acme"),
        make_adapter("beta-chat", tenant="beta"),
        make_adapter("busy-one"),
        make_adapter("pinned-one", pinned=True),
    )
