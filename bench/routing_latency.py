"""Latency of one routing decision, as thread CPU time (target: p99 <= 50 us at 64 pods
and 2,000 adapters, and at most 1.5x that at 256 pods).

The router's own decision (``Picker.pick`` under the plan policy, building its context
as the proxy does) over a topology of 64 and of 256 vLLM pods: half the adapters hot on
two pods each by the plan, every pod with 8 GPU slots and 32 adapters in host RAM, live
queues; requests draw adapters uniformly (planned, unplanned, held or not). Side by
side: the whole pool handed to the policy (before) and the candidate pre-filter
(after). ``--prefilter off`` measures only the former, ``on`` only the latter.

``--scorers`` adds the table of each scorer of ``policies.routing`` over 64 snapshots of
200 adapters (round-robin, the cheapest, as the baseline of its ratio).

Times are ``time.thread_time_ns`` around each decision: the CPU it costs, without the
preemption a shared machine adds to wall time.

    .venv/bin/python -m bench.routing_latency [--pods 64,256] [--calls 20000]
        [--prefilter both|on|off] [--scorers]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from placement.domain import AdapterId, Engine, PodId, PoolId, Tier
from placement.plan import AdapterPlan, Plan
from placement.ports import PodMetrics
from placement.router.picking import Picker
from placement.router.state import Topology, Upstream, build_topology
from placement.settings import MB, LoadCostSettings, RouterSettings, Settings
from policies.hashing import build_ring
from policies.routing import (
    HashFallback,
    PodSnapshot,
    RouteDecision,
    RoutingContext,
    route_bounded,
    route_epp,
    route_hash,
    route_least_loaded,
    route_llmd,
    route_plan,
    route_round_robin,
)


def make_pods(count: int, adapters: list[str], rng: random.Random) -> list[PodSnapshot]:
    pods = []
    for i in range(count):
        registered = rng.sample(adapters, 16)
        gpu = tuple(registered[:4])
        pods.append(
            PodSnapshot(
                pod_id=f"pod-{i}",
                queue_depth=rng.randint(0, 6),
                running=rng.randint(0, 30),
                kv_usage=rng.random() * 0.8,
                gpu_util=rng.random(),
                gpu_adapters=gpu,
                registered=frozenset(registered),
                running_adapters=frozenset(gpu[:2]),
                waiting_adapters=frozenset(gpu[2:3]),
                loading=frozenset(registered[4:5]) if i % 7 == 0 else frozenset(),
                free_slots=0,
                max_loras=4,
                victim_last_used_s=rng.random() * 100,
            )
        )
    return pods


def measure(decide: Callable[[str], object], requests: list[str]) -> tuple[float, float]:
    """p50 and p99 of one decision, microseconds of this thread's CPU time."""
    samples = []
    clock = time.thread_time_ns
    for adapter in requests:
        began = clock()
        decide(adapter)
        samples.append(clock() - began)
    samples.sort()
    return samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.99)] / 1e3


def make_topology(
    pods: int,
    adapters: list[str],
    rng: random.Random,
    *,
    used_per_pod: int = 32,
) -> Topology:
    """``pods`` vLLM pods (8 slots, 32 in host RAM); half the adapters hot on two; each
    pod with live queues and ``used_per_pod`` adapters it used lately; the pre-filter's
    ranks refreshed after the queues are observed, as the router's scrape round does
    (``Router.start`` runs the first round before it serves)."""
    upstreams = tuple(
        Upstream(
            pod=PodId(f"pod-{i}"),
            pool=PoolId("pool"),
            url=f"http://127.0.0.1:{20000 + i}",
            engine=Engine.VLLM,
            served_model="base-model",
            max_loras=8,
            max_cpu_loras=32,
        )
        for i in range(pods)
    )
    now = datetime.now(UTC)
    entries = {
        AdapterId(n): AdapterPlan(
            tier=Tier.HOT,
            pods=MappingProxyType(
                {PodId(f"pod-{i % pods}"): 0.5, PodId(f"pod-{(i + 1) % pods}"): 0.5}
            ),
        )
        for i, n in enumerate(adapters[: len(adapters) // 2])
    }
    plan = Plan(
        id="bench",
        created_at=now,
        valid_from=now,
        valid_until=now + timedelta(hours=1),
        pods=MappingProxyType({}),
        adapters=MappingProxyType(entries),
    )
    topology = build_topology(upstreams, plan)
    for state in topology.pods.values():
        state.observe(
            PodMetrics(waiting=rng.randint(0, 4), running=rng.randint(0, 8), kv_usage=0.5)
        )
        for name in rng.sample(adapters, used_per_pod):
            state.note_use(AdapterId(name), rng.random())
    for view in topology.pools.values():
        view.index.refresh()  # as the scrape round does once every pod is read
    return topology


def picker_table(pod_counts: list[int], *, calls: int, modes: list[bool]) -> None:
    """The router's decision before (whole pool) and after (pre-filter), per pool size."""
    rng = random.Random(0)
    adapters = [f"a{i}" for i in range(2000)]
    print(
        f"router decision (Picker.pick, plan policy), {len(adapters):,} adapters, "
        f"{calls:,} decisions; thread CPU us"
    )
    print(f"{'pods':>5s} {'pre-filter':>10s} {'p50 us':>8s} {'p99 us':>8s}")
    for count in pod_counts:
        topology = make_topology(count, adapters, rng)
        requests = [rng.choice(adapters) for _ in range(calls)]
        for prefilter in modes:
            picker = Picker(
                settings=RouterSettings(), load_cost=LoadCostSettings(), prefilter=prefilter
            )

            def decide(name: str, picker: Picker = picker, topology: Topology = topology) -> object:
                return picker.pick(topology, name)

            measure(decide, requests[:1000])  # warm up
            p50, p99 = measure(decide, requests)
            label = "on" if prefilter else "off"
            print(f"{count:5d} {label:>10s} {p50:8.1f} {p99:8.1f}")


def scorer_table(*, pods_count: int, calls: int) -> None:
    """Each scorer of ``policies.routing`` over snapshots, against round-robin."""
    rng = random.Random(0)
    adapters = [f"adapter-{i}" for i in range(200)]
    pods = make_pods(pods_count, adapters, rng)
    weights = [1.0 / (rank + 1) for rank in range(len(adapters))]
    requests = rng.choices(adapters, weights=weights, k=calls)
    ring = build_ring(pod.pod_id for pod in pods)
    settings = Settings()
    router, cost = settings.router, settings.load_cost
    fallback = HashFallback(ring=ring, replicas=router.hash_replicas)
    # A rank-16 adapter of about 50 MB on a busy pod (the router caches these).
    warm_s = cost.warm_load_ms(50 * MB, drain_ms=cost.expected_drain_ms) / 1e3
    cold_s = cost.cold_load_ms(50 * MB, drain_ms=cost.expected_drain_ms) / 1e3
    plan = {
        name: {f"pod-{i % pods_count}": 0.5, f"pod-{(i + 1) % pods_count}": 0.5}
        for i, name in enumerate(adapters[:60])
    }
    cursor = [0]

    def ctx(adapter: str) -> RoutingContext:
        return RoutingContext(
            adapter=adapter,
            pods=pods,
            per_request_s=router.per_request_s,
            warm_load_s=warm_s,
            cold_load_s=cold_s,
            no_load_kv_usage=router.no_load_kv_usage,
            reject_kv_usage=router.reject_kv_usage,
        )

    def round_robin(adapter: str) -> RouteDecision:
        decision, cursor[0] = route_round_robin(ctx(adapter), cursor=cursor[0])
        return decision

    routers: dict[str, Callable[[str], RouteDecision]] = {
        "round-robin": round_robin,
        "least-loaded": lambda a: route_least_loaded(ctx(a)),
        "epp": lambda a: route_epp(ctx(a)),
        "llm-d": lambda a: route_llmd(ctx(a)),
        "hash": lambda a: route_hash(ctx(a), ring, replicas=router.hash_replicas),
        "bounded": lambda a: route_bounded(ctx(a)),
        "plan": lambda a: route_plan(ctx(a), plan.get(a), fallback=fallback),
    }
    base_p99 = 0.0
    print(f"\nscorers over {pods_count} snapshots, {calls:,} decisions each; thread CPU us")
    print(f"{'router':14s} {'p50 us':>8s} {'p99 us':>8s} {'p99/round-robin':>16s}")
    for name, decide in routers.items():
        measure(decide, requests[:1000])  # warm up
        p50, p99 = measure(decide, requests)
        base_p99 = base_p99 or p99
        print(f"{name:14s} {p50:8.1f} {p99:8.1f} {p99 / base_p99:16.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", default="64,256", help="pool sizes, comma-separated")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument(
        "--prefilter",
        choices=("both", "on", "off"),
        default="both",
        help="the candidate pre-filter: before and after side by side, or one of them",
    )
    parser.add_argument("--scorers", action="store_true", help="also each scorer's table")
    args = parser.parse_args()
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.prefilter]
    pod_counts = [int(part) for part in args.pods.split(",")]
    picker_table(pod_counts, calls=args.calls, modes=modes)
    if args.scorers:
        scorer_table(pods_count=pod_counts[0], calls=args.calls)


if __name__ == "__main__":
    main()
