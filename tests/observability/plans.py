"""Small plans, fleets and catalogs built in code for the review tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from placement.domain import (
    Adapter,
    AdapterId,
    Catalog,
    Engine,
    Fleet,
    Pod,
    PodId,
    Pool,
    PoolId,
    Tier,
)
from placement.emulator.fleet import EMULATED_DIMS
from placement.plan import AdapterPlan, Plan, PodPlan, Preload, SolverReport

T0 = datetime(2026, 3, 12, 8, 0, tzinfo=UTC)
MB = 1_000_000


def make_plan(
    hot: Mapping[str, Sequence[str]],
    warm: Mapping[str, Sequence[str]] | None = None,
    *,
    plan_id: str = "plan-b",
    pinned: Mapping[str, Sequence[str]] | None = None,
    hit_rate: float = 0.9,
    preloads: Sequence[tuple[str, str]] = (),
) -> Plan:
    """``hot``/``warm``: pod -> adapters. Hot adapters share traffic equally."""
    warm = warm or {}
    pod_ids = sorted(set(hot) | set(warm))
    owners: dict[str, list[str]] = {}
    for pod, names in hot.items():
        for name in names:
            owners.setdefault(name, []).append(pod)
    adapters: dict[AdapterId, AdapterPlan] = {
        AdapterId(name): AdapterPlan(
            tier=Tier.HOT,
            pods=MappingProxyType({PodId(p): 1.0 / len(pods) for p in pods}),
        )
        for name, pods in owners.items()
    }
    for pod, names in warm.items():
        for name in names:
            if AdapterId(name) not in adapters:
                adapters[AdapterId(name)] = AdapterPlan(
                    tier=Tier.WARM, pods=MappingProxyType({PodId(pod): 1.0})
                )
    pods = {
        PodId(p): PodPlan(
            hot=tuple(AdapterId(a) for a in hot.get(p, ())),
            warm=tuple(AdapterId(a) for a in warm.get(p, ())),
            pinned=tuple(AdapterId(a) for a in (pinned or {}).get(p, ())),
            hbm_bytes_used=50 * MB * len(hot.get(p, ())),
            host_bytes_used=50 * MB * (len(hot.get(p, ())) + len(warm.get(p, ()))),
            expected_rps=0.5 * len(hot.get(p, ())),
        )
        for p in pod_ids
    }
    return Plan(
        id=plan_id,
        created_at=T0,
        valid_from=T0,
        valid_until=T0 + timedelta(hours=1),
        pods=MappingProxyType(pods),
        adapters=MappingProxyType(adapters),
        preloads=tuple(
            Preload(
                at=T0 - timedelta(minutes=15), pod=PodId(p), adapter=AdapterId(a), reason="peak"
            )
            for p, a in preloads
        ),
        predicted=MappingProxyType({"gpu_hit_rate": hit_rate, "expected_delay_ms": 12.5}),
        solver=SolverReport(status="OPTIMAL", objective=10.0, bound=10.0, gap=0.0, wall_s=0.3),
        why=MappingProxyType({AdapterId(a): f"hot: {a} is busy" for a in owners}),
    )


def make_fleet(
    n: int, *, max_loras: int = 2, max_cpu_loras: int = 4, hbm_bytes: int = 200 * MB
) -> Fleet:
    pods = tuple(
        Pod(
            name=PodId(f"pod-{i}"),
            pool=PoolId("base"),
            url=f"http://127.0.0.1:{18000 + i}",
            engine=Engine.VLLM,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=16,
            hbm_adapter_bytes=hbm_bytes,
            host_adapter_bytes=1000 * MB,
            capacity_rps=2.0,
        )
        for i in range(n)
    )
    pool = Pool(
        name=PoolId("base"),
        base_model="base-model",
        served_model_name="base-model",
        engine=Engine.VLLM,
        max_lora_rank=16,
        dims=EMULATED_DIMS,
        pods=pods,
    )
    return Fleet(pools=(pool,))


def make_catalog(names: Sequence[str], **overrides: Mapping[str, object]) -> Catalog:
    """Adapters of 50 MB; ``overrides[name]`` sets fields (pinned, min_replicas, group)."""
    adapters = []
    for name in names:
        fields: dict[str, object] = {
            "name": AdapterId(name),
            "base_model": "base-model",
            "rank": 8,
            "alpha": 8.0,
            "target_modules": ("q_proj", "v_proj"),
            "dtype": "float16",
            "source": f"/adapters/{name}",
            "size_bytes": 50 * MB,
        }
        fields.update(overrides.get(name.replace("-", "_"), {}))
        adapters.append(Adapter(**fields))  # type: ignore[arg-type]
    return Catalog(adapters=tuple(adapters))
