"""Domain values built in code, for every test folder and for bench/.

Adapters (50 MiB, rank 16, Llama-3.1-8B by default), pods and pools of identical vLLM
pods, fleets, demands, small plans, and a clock that moves only when a test moves it.
Defaults say nothing surprising; a test names what matters to it.

Imported as ``from tests.factories import ...``: tests/ is a package and pytest puts
the repository root on the path (``pythonpath`` in pyproject.toml); bench scripts run
as ``python -m bench.NAME`` from the root. Builds values only: no files, no network,
no fixtures (fixtures live in the conftest.py files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

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
    TenantId,
    Tier,
)
from placement.plan import AdapterPlan, Plan, PodPlan, Preload, SolverReport
from placement.sim.workload import SimWorkload
from placement.sizing import BUILTIN_MODELS
from placement.solver.problem import Demand

MIB = 1 << 20
#: A Monday, 08:00 UTC: plans are created here and fake clocks start here.
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
BASE = "llama-3.1-8b"
#: Small dimensions: the solver's tests need a pool's shape, not a real model.
TINY_DIMS = ModelDims(
    name="tiny",
    hidden_size=1024,
    num_layers=4,
    num_attention_heads=8,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=4096,
)
#: What ``make_plan`` counts for each adapter it places.
PLAN_ADAPTER_BYTES = 50 * MIB
PLAN_ADAPTER_RPS = 0.5


def adapter(
    name: str,
    *,
    base: str = BASE,
    rank: int = 16,
    size_mib: int = 50,
    size_bytes: int | None = None,
    source: str | None = None,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    pinned: bool = False,
    pinned_pods: Sequence[str] = (),
    min_replicas: int = 1,
    max_replicas: int = 4,
    group: str | None = None,
    tenant: str | None = None,
) -> Adapter:
    """An adapter of ``size_mib`` MiB (``size_bytes``, when given, is exact)."""
    return Adapter(
        name=AdapterId(name),
        base_model=base,
        rank=rank,
        alpha=float(rank),
        target_modules=target_modules,
        dtype="float16",
        source=source if source is not None else f"/adapters/{name}",
        size_bytes=size_bytes if size_bytes is not None else size_mib * MIB,
        pinned=pinned,
        pinned_pods=tuple(PodId(p) for p in pinned_pods),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        group=group,
        tenant=TenantId(tenant) if tenant else None,
    )


def catalog(*adapters: Adapter) -> Catalog:
    return Catalog(adapters=tuple(adapters))


def pod(
    name: str,
    *,
    pool: str = "p",
    url: str = "http://127.0.0.1:18000",
    engine: Engine = Engine.VLLM,
    max_loras: int = 4,
    max_cpu_loras: int = 8,
    max_lora_rank: int = 64,
    hbm_mib: int = 1024,
    host_mib: int = 4096,
    capacity_rps: float = 100.0,
) -> Pod:
    return Pod(
        name=PodId(name),
        pool=PoolId(pool),
        url=url,
        engine=engine,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
        max_lora_rank=max_lora_rank,
        hbm_adapter_bytes=hbm_mib * MIB,
        host_adapter_bytes=host_mib * MIB,
        capacity_rps=capacity_rps,
    )


def pool(
    name: str,
    pods: int,
    *,
    base: str = BASE,
    served_model: str | None = None,
    pod_prefix: str | None = None,
    dims: ModelDims = TINY_DIMS,
    urls: Sequence[str] = (),
    engine: Engine = Engine.VLLM,
    max_lora_rank: int = 64,
    **budgets: Any,
) -> Pool:
    """``pods`` identical pods named ``{pod_prefix or name}-{i}``, on ports 18000 + i
    unless ``urls`` names them; ``budgets`` are ``pod``'s (max_loras, hbm_mib, ...)."""
    prefix = pod_prefix or name
    members = tuple(
        pod(
            f"{prefix}-{i}",
            pool=name,
            url=urls[i] if i < len(urls) else f"http://127.0.0.1:{18000 + i}",
            engine=engine,
            max_lora_rank=max_lora_rank,
            **budgets,
        )
        for i in range(pods)
    )
    return Pool(
        name=PoolId(name),
        base_model=base,
        served_model_name=served_model or base,
        engine=engine,
        max_lora_rank=max_lora_rank,
        dims=dims,
        pods=members,
    )


def fleet(*pools: Pool) -> Fleet:
    return Fleet(pools=tuple(pools))


def demand(rates: Mapping[str, float], *, q90_factor: float = 1.5) -> dict[AdapterId, Demand]:
    return {
        AdapterId(name): Demand(mean_rps=rate, q90_rps=rate * q90_factor)
        for name, rate in rates.items()
    }


def make_plan(
    hot: Mapping[str, Iterable[str]] | None = None,
    warm: Mapping[str, Iterable[str]] | None = None,
    *,
    plan_id: str = "plan",
    pinned: Mapping[str, Iterable[str]] | None = None,
    created: datetime = T0,
    valid_for: timedelta = timedelta(hours=1),
    hit_rate: float = 0.9,
    preloads: Iterable[tuple[str, str]] = (),
) -> Plan:
    """A plan from ``hot`` and ``warm`` (pod -> adapters), valid from ``created`` for
    ``valid_for``; every pod named is in it.

    An adapter hot on any pod is hot, its traffic shared equally by those pods; one only
    warm is warm on every pod listing it. Each placed adapter counts PLAN_ADAPTER_BYTES
    and each hot one PLAN_ADAPTER_RPS; ``preloads`` are (pod, adapter) 15 minutes before
    ``created``. The report is fixed: ``hit_rate``, an OPTIMAL solver, a reason per hot
    adapter. Without ``hot``: pod-0 holds a1 and a2 hot, pod-1 holds a2.
    """
    if hot is None:
        hot = {"pod-0": ("a1", "a2"), "pod-1": ("a2",)}
    hot_on = {p: tuple(AdapterId(a) for a in names) for p, names in hot.items()}
    warm_on = {p: tuple(AdapterId(a) for a in names) for p, names in (warm or {}).items()}
    pinned_on = {p: tuple(AdapterId(a) for a in names) for p, names in (pinned or {}).items()}
    pods = {
        PodId(p): PodPlan(
            hot=hot_on.get(p, ()),
            warm=warm_on.get(p, ()),
            pinned=pinned_on.get(p, ()),
            hbm_bytes_used=PLAN_ADAPTER_BYTES * len(hot_on.get(p, ())),
            host_bytes_used=PLAN_ADAPTER_BYTES * len(hot_on.get(p, ()) + warm_on.get(p, ())),
            expected_rps=PLAN_ADAPTER_RPS * len(hot_on.get(p, ())),
        )
        for p in sorted(set(hot_on) | set(warm_on))
    }
    hot_adapters = _holders(hot_on)
    adapters = {name: _shared(Tier.HOT, owners) for name, owners in hot_adapters.items()}
    for name, owners in _holders(warm_on).items():
        adapters.setdefault(name, _shared(Tier.WARM, owners))
    return Plan(
        id=plan_id,
        created_at=created,
        valid_from=created,
        valid_until=created + valid_for,
        pods=MappingProxyType(pods),
        adapters=MappingProxyType(adapters),
        preloads=tuple(
            Preload(
                at=created - timedelta(minutes=15),
                pod=PodId(p),
                adapter=AdapterId(a),
                reason="peak",
            )
            for p, a in preloads
        ),
        predicted=MappingProxyType({"gpu_hit_rate": hit_rate, "expected_delay_ms": 12.5}),
        solver=SolverReport(status="OPTIMAL", objective=10.0, bound=10.0, gap=0.0, wall_s=0.3),
        why=MappingProxyType({name: f"hot: {name} is busy" for name in hot_adapters}),
    )


def _holders(placed: Mapping[str, tuple[AdapterId, ...]]) -> dict[AdapterId, list[PodId]]:
    holders: dict[AdapterId, list[PodId]] = {}
    for pod_name, names in placed.items():
        for name in names:
            holders.setdefault(name, []).append(PodId(pod_name))
    return holders


def _shared(tier: Tier, owners: Sequence[PodId]) -> AdapterPlan:
    return AdapterPlan(
        tier=tier, pods=MappingProxyType({owner: 1.0 / len(owners) for owner in owners})
    )


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


def replay_fleet(
    count: int = 1, *, max_loras: int = 4, max_cpu_loras: int = 8, model: str = BASE
) -> Fleet:
    """One vLLM pool of ``count`` pods of ``model``'s real dimensions, for the replay."""
    pods = tuple(
        Pod(
            name=PodId(f"pod-{i}"),
            pool=PoolId("p"),
            url=f"http://127.0.0.1:{18000 + i}",
            engine=Engine.VLLM,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=64,
            hbm_adapter_bytes=1024 * MIB,
            host_adapter_bytes=4096 * MIB,
            capacity_rps=10,
        )
        for i in range(count)
    )
    pool = Pool(
        name=PoolId("p"),
        base_model=model,
        served_model_name=model,
        engine=Engine.VLLM,
        max_lora_rank=64,
        dims=BUILTIN_MODELS[model],
        pods=pods,
    )
    return Fleet(pools=(pool,))


def replay_catalog(
    size_bytes: Mapping[str, int],
    *,
    model: str = BASE,
    tenant_of: Callable[[str], TenantId | None] = lambda name: None,
) -> Catalog:
    """Rank-16 q/v adapters of the given sizes, in name order, for the replay."""
    return Catalog(
        adapters=tuple(
            Adapter(
                name=AdapterId(name),
                base_model=model,
                rank=16,
                alpha=16.0,
                target_modules=("q_proj", "v_proj"),
                dtype="float16",
                source=f"/adapters/{name}",
                size_bytes=size,
                tenant=tenant_of(name),
            )
            for name, size in sorted(size_bytes.items())
        )
    )


def event_workload(
    rows: Iterable[tuple[float, str, str | None]],
    *,
    start: datetime = datetime(2026, 3, 10, 9, tzinfo=UTC),
) -> SimWorkload:
    """A replay workload of ``(arrival s, adapter, event id or None)`` rows, in time
    order: 100 prompt and 10 output tokens a request, 50 MB adapters."""
    ordered = sorted(rows, key=lambda row: row[0])
    return SimWorkload(
        start=start,
        arrival_s=[at for at, _, _ in ordered],
        adapters=[name for _, name, _ in ordered],
        prompt_tokens=[100] * len(ordered),
        output_tokens=[10] * len(ordered),
        size_bytes=dict.fromkeys({name for _, name, _ in ordered}, 50_000_000),
        event_ids=[event_id for _, _, event_id in ordered],
    )
