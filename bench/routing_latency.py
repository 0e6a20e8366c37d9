"""Latency of one routing decision over 64 pods, per scorer (target: p99 <= 50 us).

Each pod holds 4 of 200 adapters on GPU, 16 registered, a few running and waiting;
requests draw adapters Zipf-like. Every call builds its ``RoutingContext`` (as the
router and the simulator do), so the figure is the whole decision. Baseline in the
same run: round-robin, the cheapest router; the ratio is each scorer's p99 over it.

    .venv/bin/python bench/routing_latency.py [--pods 64] [--calls 20000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from placement.settings import MB, Settings
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


def measure(decide: Callable[[str], RouteDecision], requests: list[str]) -> tuple[float, float]:
    samples = []
    for adapter in requests:
        began = time.perf_counter_ns()
        decide(adapter)
        samples.append(time.perf_counter_ns() - began)
    samples.sort()
    return samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.99)] / 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(0)
    adapters = [f"adapter-{i}" for i in range(200)]
    pods = make_pods(args.pods, adapters, rng)
    weights = [1.0 / (rank + 1) for rank in range(len(adapters))]
    requests = rng.choices(adapters, weights=weights, k=args.calls)
    ring = build_ring(pod.pod_id for pod in pods)
    settings = Settings()
    router, cost = settings.router, settings.load_cost
    fallback = HashFallback(ring=ring, replicas=router.hash_replicas)
    # A rank-16 adapter of about 50 MB on a busy pod (the router caches these).
    warm_s = cost.warm_load_ms(50 * MB, drain_ms=cost.expected_drain_ms) / 1e3
    cold_s = cost.cold_load_ms(50 * MB, drain_ms=cost.expected_drain_ms) / 1e3
    plan = {
        name: {f"pod-{i % args.pods}": 0.5, f"pod-{(i + 1) % args.pods}": 0.5}
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
    print(f"{args.pods} pods, {args.calls:,} decisions each")
    print(f"{'router':14s} {'p50 us':>8s} {'p99 us':>8s} {'p99/round-robin':>16s}")
    for name, decide in routers.items():
        measure(decide, requests[:1000])  # warm up
        p50, p99 = measure(decide, requests)
        base_p99 = base_p99 or p99
        print(f"{name:14s} {p50:8.1f} {p99:8.1f} {p99 / base_p99:16.2f}")


if __name__ == "__main__":
    main()
