"""Hot replicas onto pods with CP-SAT, for counts the greedy packer cannot fit.

Stage 1 decides replica counts against pool totals; per pod, GPU slots, GPU bytes
and q90 capacity are a vector packing that a greedy can miss when a budget is
exactly full (every slot of the pool taken). This model places exactly the hot
counts, pins on their named pods, within every per-pod budget and the churn limit,
and prefers pods that hold the adapter already and pods of its affinity group. With
two or more zones, an adapter's replicas spread over them (at most ``zone_cap`` in one
zone) when the pods allow; when they do not, the model is solved again without it.
Warm registrations are then placed around it by ``placement.solver.packing.assign_around``.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from ortools.sat.python import cp_model

from placement.domain import AdapterId, PodId
from placement.solver.greedy import Counts
from placement.solver.problem import Candidate, PodClass, PoolProblem
from placement.solver.timing import limit, spent_s

#: Objective weights: a new load costs this much; a replica beside a group member earns
#: a smaller bonus, so that stability wins over co-location.
NEW_LOAD_COST = 10
GROUP_BONUS = 1


def pack_hot(
    problem: PoolProblem,
    counts: Counts,
    *,
    time_limit_s: float,
    workers: int,
    seed: int,
    reproducible: bool = False,
) -> tuple[dict[AdapterId, tuple[PodId, ...]] | None, float]:
    """Pods for every hot replica in ``counts`` (None when none found in time), and the
    seconds CP-SAT took (``placement.solver.timing``); replicas spread over zones when
    that is feasible."""
    placed, wall_s = _pack(
        problem,
        counts,
        zones=True,
        time_limit_s=time_limit_s,
        workers=workers,
        seed=seed,
        reproducible=reproducible,
    )
    if placed is not None or len(problem.zone_names) < 2:
        return placed, wall_s
    rest = max(0.1, time_limit_s - wall_s)
    placed, more_s = _pack(
        problem,
        counts,
        zones=False,
        time_limit_s=rest,
        workers=workers,
        seed=seed,
        reproducible=reproducible,
    )
    return placed, wall_s + more_s


def _pack(
    problem: PoolProblem,
    counts: Counts,
    *,
    zones: bool,
    time_limit_s: float,
    workers: int,
    seed: int,
    reproducible: bool,
) -> tuple[dict[AdapterId, tuple[PodId, ...]] | None, float]:
    model = cp_model.CpModel()
    by_name = {c.name: c for c in problem.candidates}
    totals: dict[AdapterId, int] = {}
    for (adapter, _), n in counts.hot.items():
        totals[adapter] = totals.get(adapter, 0) + n
    x: dict[tuple[AdapterId, PodId], cp_model.IntVar] = {}
    objective: list[cp_model.LinearExprT] = []
    for cls in problem.classes:
        for (adapter, key), n in counts.hot.items():
            if key == cls.key and n:
                objective.extend(_replicas(model, x, by_name[adapter], cls, n, problem))
    for cls in problem.classes:
        for pod in cls.pods:
            _pod_budgets(model, x, by_name, totals, cls, pod, problem)
    if zones:
        _zone_spread(model, x, totals, problem)
    objective.extend(_group_bonus(model, x, by_name, problem))
    model.minimize(sum(objective))
    solver = cp_model.CpSolver()
    limit(solver, max(0.1, time_limit_s), workers=workers, seed=seed, reproducible=reproducible)
    if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, spent_s(solver, reproducible=reproducible)
    placed: dict[AdapterId, list[PodId]] = {}
    for (adapter, pod), var in sorted(x.items()):
        if solver.value(var):
            placed.setdefault(adapter, []).append(pod)
    return {adapter: tuple(pods) for adapter, pods in placed.items()}, spent_s(
        solver, reproducible=reproducible
    )


def _replicas(
    model: cp_model.CpModel,
    x: dict[tuple[AdapterId, PodId], cp_model.IntVar],
    candidate: Candidate,
    cls: PodClass,
    count: int,
    problem: PoolProblem,
) -> list[cp_model.LinearExprT]:
    """Exactly ``count`` replicas in the class, named pins included; new loads cost."""
    costs: list[cp_model.LinearExprT] = []
    row = []
    for pod in cls.pods:
        var = model.new_bool_var(f"x[{candidate.name},{pod}]")
        x[(candidate.name, pod)] = var
        row.append(var)
        if pod in candidate.pinned_pods:
            model.add(var == 1)
        if (candidate.name, pod) not in problem.current_hot:
            costs.append(NEW_LOAD_COST * var)
    model.add(sum(row) == count)
    return costs


def _pod_budgets(
    model: cp_model.CpModel,
    x: Mapping[tuple[AdapterId, PodId], cp_model.IntVar],
    by_name: Mapping[AdapterId, Candidate],
    totals: Mapping[AdapterId, int],
    cls: PodClass,
    pod: PodId,
    problem: PoolProblem,
) -> None:
    here = [(by_name[a], var) for (a, p), var in x.items() if p == pod]
    # GPU slots, GPU bytes and host places of this pod.
    model.add(sum(var for _, var in here) <= cls.max_loras)
    model.add(sum(c.size_bytes * var for c, var in here) <= cls.hbm_bytes)
    model.add(sum(var for _, var in here) <= cls.max_cpu_loras)
    model.add(sum(c.size_bytes * var for c, var in here) <= cls.host_bytes)
    # q90 traffic with an equal split over the replicas, within capacity and headroom;
    # a replica too busy for this pod is left out of the sum but has the pod alone, as
    # the greedy gives it (two such, or one beside others, would be over the limit).
    limit = cls.capacity_rps * problem.headroom
    shares = [(round(c.q90_rps / totals[c.name] * 1000), var) for c, var in here]
    model.add(
        sum(mrps * var for mrps, var in shares if mrps <= limit * 1000) <= round(limit * 1000)
    )
    for mrps, var in shares:
        if mrps > limit * 1000:
            model.add(sum(other for _, other in shares if other is not var) == 0).only_enforce_if(
                var
            )
    # Churn: new registrations on this pod (pins exempt).
    if problem.churn_limit is not None:
        new = [
            var
            for c, var in here
            if not c.pinned and (c.name, pod) not in problem.current_registered
        ]
        if new:
            model.add(sum(new) <= problem.churn_limit)


def _zone_spread(
    model: cp_model.CpModel,
    x: Mapping[tuple[AdapterId, PodId], cp_model.IntVar],
    totals: Mapping[AdapterId, int],
    problem: PoolProblem,
) -> None:
    # Zones: an adapter with several hot replicas keeps at most its even share of them in
    # one zone, so that losing a zone leaves it hot elsewhere.
    by_zone: dict[tuple[AdapterId, str], list[cp_model.IntVar]] = {}
    for (adapter, pod), var in x.items():
        zone = problem.zones.get(pod)
        if zone is not None and problem.zone_cap(totals[adapter]) is not None:
            by_zone.setdefault((adapter, zone), []).append(var)
    for (adapter, _), row in sorted(by_zone.items()):
        cap = problem.zone_cap(totals[adapter])
        if cap is not None and len(row) > cap:
            model.add(sum(row) <= cap)


def _group_bonus(
    model: cp_model.CpModel,
    x: Mapping[tuple[AdapterId, PodId], cp_model.IntVar],
    by_name: Mapping[AdapterId, Candidate],
    problem: PoolProblem,
) -> list[cp_model.LinearExprT]:
    """Affinity groups prefer shared pods: a bonus per pod that holds two or more members."""
    members: dict[tuple[str, PodId], list[cp_model.IntVar]] = {}
    for (adapter, pod), var in x.items():
        group = by_name[adapter].group
        if group:
            members.setdefault((group, pod), []).append(var)
    bonus: list[cp_model.LinearExprT] = []
    for (group, pod), row in sorted(members.items()):
        if len(row) < 2:
            continue
        shared = model.new_bool_var(f"shared[{group},{pod}]")
        model.add(sum(row) >= 2).only_enforce_if(shared)
        bonus.append(-GROUP_BONUS * shared)
    return bonus
