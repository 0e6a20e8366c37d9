"""How fast and how close to optimal the placement solver is, against the direct model.

Generated problems (two pools of identical pods, power-law demand, ranks 8-128,
10 pins, replication 2 for the busiest 10%) at the three target sizes. For each:
lorafleet's solver (pod classes, greedy hint, two stages) and, where practical, the
baseline: one CP-SAT boolean per (adapter, pod) for hot and for warm, the same
objective, no hint, the same time limit and workers. lorafleet's limit is a deadline
for the whole solve, the problem's building included, as ``lorafleet plan``'s. Both
plans are priced by the same yardstick (``placement.solver.assignment.evaluate`` without
the imbalance term, which the baseline does not model), and the baseline's ratio to
ours is printed.

    .venv/bin/python -m bench.solver_scale            # all three sizes
    .venv/bin/python -m bench.solver_scale --only 200x16

The catalog and fleet are built with ``tests.factories``, hence ``-m`` from the root.
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from placement.domain import AdapterId, Catalog, Fleet, PodId
from placement.settings import PlannerSettings, Settings
from placement.sizing import BUILTIN_MODELS
from placement.solver import options_from, solve
from placement.solver.assignment import Assignment, evaluate
from placement.solver.greedy import hot_eligible, warm_eligible
from placement.solver.problem import Demand, PlacementProblem, PoolProblem
from placement.solver.problem_build import build_problem
from placement.solver.timing import Deadline
from tests import factories

BASES = ("llama-3.1-8b", "mistral-7b")


def generate(
    adapters: int, pods: int, *, seed: int = 7
) -> tuple[Catalog, Fleet, dict[AdapterId, Demand], PlannerSettings]:
    rng = np.random.default_rng(seed)
    # 6.25 requests/s per pod on average (400 on 64 pods), whatever the size.
    total_rps = 6.25 * pods
    ranks = rng.choice([8, 16, 32, 64, 128], size=adapters, p=[0.2, 0.35, 0.25, 0.15, 0.05])
    weights = 1.0 / np.arange(1, adapters + 1) ** 1.1
    rng.shuffle(weights)
    rates = total_rps * weights / weights.sum()
    order = np.argsort(-rates)
    pinned = set(order[:10].tolist())
    names = [f"ad-{i:05d}" for i in range(adapters)]
    catalog = factories.catalog(
        *(
            factories.adapter(
                names[i],
                base=BASES[i % 2],
                rank=int(ranks[i]),
                # About 3.2 MB per unit of rank: rank 16 is the typical 50 MB adapter.
                size_bytes=int(ranks[i]) * 3_200_000,
                source=f"/a/{i}",
                pinned=i in pinned,
                max_replicas=32,
            )
            for i in range(adapters)
        )
    )
    # Pods carry about 3x the mean load, so capacity binds only for the busiest adapters.
    capacity = math.ceil(total_rps * 3.0 / pods)
    fleet = factories.fleet(
        *(
            factories.pool(
                name,
                pods // 2,
                base=base,
                dims=BUILTIN_MODELS[BASES[0]],
                max_loras=16,
                max_cpu_loras=64,
                max_lora_rank=128,
                hbm_mib=2048,
                host_mib=16384,
                capacity_rps=capacity,
            )
            for name, base in (("pool-a", BASES[0]), ("pool-b", BASES[1]))
        )
    )
    demand = factories.demand({name: float(rate) for name, rate in zip(names, rates, strict=True)})
    # Replication 2 for the busiest 10%: the share of the adapter at the 90th percentile.
    threshold = float(np.sort(rates)[::-1][max(0, adapters // 10 - 1)]) / total_rps
    planner = PlannerSettings(replicate_share=threshold, time_limit_s=10.0, workers=2)
    return catalog, fleet, demand, planner


#: A CP-SAT variable per (adapter, pod); ortools' types are not checked (no stubs).
PairVars = dict[tuple[AdapterId, PodId], Any]


def direct_model(problem: PoolProblem) -> tuple[cp_model.CpModel, PairVars, PairVars]:
    """The baseline: a boolean per (adapter, pod) for hot and for warm, no aggregation."""
    model = cp_model.CpModel()
    pods = {pod: cls for cls in problem.classes for pod in cls.pods}
    hot, warm, terms = {}, {}, []
    for c in problem.candidates:
        h_any, w_any = model.new_bool_var(""), model.new_bool_var("")
        model.add(h_any + w_any <= 1)
        hs, ws = [], []
        for pod, cls in pods.items():
            h = model.new_bool_var("") if hot_eligible(c, cls) else model.new_constant(0)
            w = model.new_bool_var("") if warm_eligible(c, cls) else model.new_constant(0)
            model.add(h + w <= 1)
            hot[(c.name, pod)], warm[(c.name, pod)] = h, w
            hs.append(h)
            ws.append(w)
            load = (c.activate_ms + c.fetch_ms) / problem.validity_s
            terms.append(round(load * 1e4) * h + round(c.fetch_ms / problem.validity_s * 1e4) * w)
        for pod in c.pinned_pods:
            model.add(hot[(c.name, pod)] == 1)
        if c.pinned:
            model.add(h_any == 1)
        model.add(sum(hs) >= c.min_hot * h_any)
        model.add(sum(hs) <= c.max_hot * h_any)
        model.add(sum(ws) == w_any)
        terms.append(-round(c.mean_rps * c.cold_miss_ms * 1e4) * h_any)
        terms.append(-round(c.mean_rps * (c.cold_miss_ms - c.warm_miss_ms) * 1e4) * w_any)
    for pod, cls in pods.items():
        cands = problem.candidates
        model.add(sum(hot[(c.name, pod)] for c in cands) <= cls.max_loras)
        model.add(sum(hot[(c.name, pod)] + warm[(c.name, pod)] for c in cands) <= cls.max_cpu_loras)
        model.add(sum(c.size_bytes * hot[(c.name, pod)] for c in cands) <= cls.hbm_bytes)
        model.add(
            sum(c.size_bytes * (hot[(c.name, pod)] + warm[(c.name, pod)]) for c in cands)
            <= cls.host_bytes
        )
        model.add(
            sum(round(c.q90_rps / max(1, c.min_hot) * 1000) * hot[(c.name, pod)] for c in cands)
            <= round(cls.capacity_rps * problem.headroom * 1000)
        )
    model.minimize(sum(terms))
    return model, hot, warm


def run_direct(problem: PlacementProblem, time_limit_s: float) -> tuple[float, float, str]:
    """Baseline objective (by ``evaluate``, no imbalance), its bound, and its status."""
    objective, bound, statuses = 0.0, 0.0, []
    for pool in problem.pools:
        model, hot, warm = direct_model(pool)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = (
            time_limit_s * len(pool.candidates) / sum(len(p.candidates) for p in problem.pools)
        )
        solver.parameters.num_workers = 2
        status = solver.solve(model)
        statuses.append(solver.status_name(status))
        constant = sum(c.mean_rps * c.cold_miss_ms for c in pool.candidates)
        bound += constant + solver.best_objective_bound / 1e4
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            objective = math.inf
            continue
        held_hot: dict[AdapterId, list[PodId]] = {}
        held_warm: dict[AdapterId, list[PodId]] = {}
        for (name, pod), var in hot.items():
            if solver.value(var):
                held_hot.setdefault(name, []).append(pod)
        for (name, pod), var in warm.items():
            if solver.value(var):
                held_warm.setdefault(name, []).append(pod)
        weights = {a: MappingProxyType(dict.fromkeys(p, 1 / len(p))) for a, p in held_hot.items()}
        assignment = Assignment(
            hot={a: tuple(p) for a, p in held_hot.items()},
            warm={a: tuple(p) for a, p in held_warm.items()},
            weights=weights,
        )
        cost = evaluate(pool, assignment)
        objective += cost.miss_ms_per_s + cost.load_ms_per_s
    return objective, bound, "/".join(statuses)


def run(label: str, adapters: int, pods: int, time_limit_s: float, *, baseline: bool) -> None:
    catalog, fleet, demand, planner = generate(adapters, pods)
    settings = Settings(planner=planner)
    # As ``lorafleet plan`` solves: the limit a deadline from before the problem's build.
    deadline = Deadline.after(time_limit_s, clock=time.monotonic)
    started = time.monotonic()
    problem = build_problem(
        catalog, fleet, demand, settings=settings, valid_from=datetime(2026, 3, 2, 9, tzinfo=UTC)
    )
    built_s = time.monotonic() - started
    options = options_from(problem, time_limit_s=time_limit_s)
    solution = solve(problem, options=options, deadline=deadline)
    total_s = time.monotonic() - started
    report = solution.report
    ours = sum(s.cost.miss_ms_per_s + s.cost.load_ms_per_s for s in solution.pools)
    imbalance = sum(s.cost.imbalance_ms_per_s for s in solution.pools)
    sources = "/".join(f"{s.report.status}:{s.source}" for s in solution.pools)
    print(f"\n== {label}: {adapters} adapters x {pods} pods, limit {time_limit_s:g} s, 2 workers")
    print(
        f"lorafleet: {total_s:.2f} s wall of {time_limit_s:g} s (build {built_s:.2f} s,"
        f" CP-SAT {report.wall_s:.2f} s)"
        f"  status {report.status} [{sources}]"
    )
    print(
        f"  objective {report.objective:.2f} ms/s (misses+loads {ours:.2f}, imbalance"
        f" {imbalance:.2f}), bound {report.bound:.2f}, gap {report.gap:.3%}"
    )
    if not baseline:
        return
    started = time.perf_counter()
    direct, direct_bound, status = run_direct(problem, time_limit_s)
    direct_s = time.perf_counter() - started
    print(f"direct (bool per adapter x pod, no hint): {direct_s:.2f} s, status {status}")
    if not math.isfinite(direct):
        print(f"  no plan within {time_limit_s:g} s (lorafleet's bound {report.bound:.2f})")
        return
    gap = (direct - direct_bound) / direct
    print(
        f"  objective {direct:.2f} ms/s, bound {direct_bound:.2f}, gap {gap:.1%},"
        f" ratio to lorafleet {direct / ours:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["200x16", "2000x64", "10000x256"])
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    sizes = [
        ("200x16", 200, 16, 2.0, True),
        ("2000x64", 2000, 64, 10.0, True),
        ("10000x256", 10000, 256, 60.0, False),
    ]
    for label, adapters, pods, limit, baseline in sizes:
        if args.only in (None, label):
            run(label, adapters, pods, limit, baseline=baseline and not args.no_baseline)


if __name__ == "__main__":
    main()
