"""Small catalogs, fleets and demands for the solver's tests, built directly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from placement.domain import (
    Adapter,
    AdapterId,
    Catalog,
    Engine,
    Fleet,
    ModelDims,
    Pod,
    PodId,
    Pool,
    PoolId,
)
from placement.solver.problem import Demand

MIB = 1 << 20
DIMS = ModelDims(
    name="tiny",
    hidden_size=1024,
    num_layers=4,
    num_attention_heads=8,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=4096,
)


def adapter(
    name: str,
    *,
    base: str = "llama-3.1-8b",
    rank: int = 16,
    size_mib: int = 50,
    pinned: bool = False,
    pinned_pods: Sequence[str] = (),
    min_replicas: int = 1,
    max_replicas: int = 4,
    group: str | None = None,
) -> Adapter:
    return Adapter(
        name=AdapterId(name),
        base_model=base,
        rank=rank,
        alpha=float(rank),
        target_modules=("q_proj", "v_proj"),
        dtype="float16",
        source=f"/adapters/{name}",
        size_bytes=size_mib * MIB,
        pinned=pinned,
        pinned_pods=tuple(PodId(p) for p in pinned_pods),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        group=group,
    )


def pool(
    name: str,
    pods: int,
    *,
    base: str = "llama-3.1-8b",
    max_loras: int = 4,
    max_cpu_loras: int = 8,
    max_lora_rank: int = 64,
    hbm_mib: int = 1024,
    host_mib: int = 4096,
    capacity_rps: float = 100.0,
) -> Pool:
    members = tuple(
        Pod(
            name=PodId(f"{name}-{i}"),
            pool=PoolId(name),
            url=f"http://127.0.0.1:{18000 + i}",
            engine=Engine.VLLM,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=max_lora_rank,
            hbm_adapter_bytes=hbm_mib * MIB,
            host_adapter_bytes=host_mib * MIB,
            capacity_rps=capacity_rps,
        )
        for i in range(pods)
    )
    return Pool(
        name=PoolId(name),
        base_model=base,
        served_model_name=base,
        engine=Engine.VLLM,
        max_lora_rank=max_lora_rank,
        dims=DIMS,
        pods=members,
    )


def catalog(*adapters: Adapter) -> Catalog:
    return Catalog(adapters=tuple(adapters))


def fleet(*pools: Pool) -> Fleet:
    return Fleet(pools=tuple(pools))


def demand(rates: Mapping[str, float], *, q90_factor: float = 1.5) -> dict[AdapterId, Demand]:
    return {
        AdapterId(name): Demand(mean_rps=rate, q90_rps=rate * q90_factor)
        for name, rate in rates.items()
    }
