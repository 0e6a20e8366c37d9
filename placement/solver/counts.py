"""Stage 1 of placement: CP-SAT over replica counts per adapter and class of pods.

For every adapter, whether it is hot or warm and how many hot replicas and warm
registrations it has in each class of identical pods, within the class totals of
slots, host places and bytes. Pods of a class are interchangeable, so this model has a
handful of variables per adapter instead of one per (adapter, pod), and its optimum
bounds the full problem's. ``placement.solver.infeasible`` rebuilds it with one
constraint family left out to say why a pool has no plan.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ortools.sat.python import cp_model

from placement.solver.greedy import (
    ClassKey,
    Counts,
    current_per_class,
    hot_eligible,
    named_pins_per_class,
    warm_eligible,
)
from placement.solver.patterns import add_capacity_cuts, add_pattern_constraints
from placement.solver.problem import Candidate, PlacementProblem, PoolProblem
from placement.solver.timing import limit

#: Objective coefficients are integers, in 1/10,000 ms of delay per second.
SCALE = 10_000.0
#: Pools with at least this many adapters use all workers and stop at ``gap_limit``;
#: smaller ones are solved on one worker (deterministic) to proven optimality.
LARGE_POOL_ADAPTERS = 1000
#: Constraint families that ``build_model`` can leave out, to explain infeasibility.
FAMILIES = ("pins", "replication", "churn")


@dataclass(frozen=True, kw_only=True)
class ModelVars:
    """The decision variables of one pool's model, keyed by adapter and class key."""

    hot: Mapping[str, cp_model.IntVar]
    warm: Mapping[str, cp_model.IntVar]
    replicas: Mapping[ClassKey, cp_model.IntVar]
    registered: Mapping[ClassKey, cp_model.IntVar]
    #: Per adapter: the imbalance variable, its mean and the pod mean (milli-rps).
    excess: Mapping[str, tuple[cp_model.IntVar, int, int]]
    #: The all-cold delay the savings are counted against; the model's objective
    #: includes it, so that CP-SAT's relative gap is the plan's.
    constant_ms_per_s: float


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """CP-SAT's limits; ``options_from`` takes them from ``PlannerSettings``."""

    time_limit_s: float
    workers: int
    seed: int
    #: Byte budgets are scaled by this in stage 1.
    scale: float = 1.0
    #: Stage 1 stops once its objective is within this fraction of the bound.
    gap_limit: float
    #: CP-SAT's deterministic time limit (its own work units): a solve that ends by it
    #: gives the same answer on any machine, unlike one that ends by wall time.
    deterministic_time: float | None = None
    #: Stage 1 sees whole pods where they bind (GPU fills, pool capacity) and stage 2
    #: retries and tops up; False is pool totals alone, the earlier solver, kept as
    #: the baseline ``bench.solver_overload`` compares against.
    per_pod: bool = True
    #: Every CP-SAT search on one worker, stopped by deterministic time and counted in
    #: it (``placement.solver.timing``): the same inputs give the same plan however busy
    #: the machine. A replay's planner solves so; the controller's, by the wall clock.
    reproducible: bool = False


def build_model(
    problem: PoolProblem,
    *,
    relax: frozenset[str] = frozenset(),
    scale: float = 1.0,
    per_pod: bool = True,
) -> tuple[cp_model.CpModel, ModelVars]:
    """Stage 1 of one pool: replica counts per adapter and pod class; without
    ``per_pod``, pool totals only (no whole-pod fills, no capacity cut)."""
    builder = _Stage1(problem, relax=relax)
    for candidate in problem.candidates:
        builder.add_adapter(candidate)
    _add_budgets(builder.model, problem, builder.replicas, builder.registered, scale=scale)
    if per_pod:
        add_pattern_constraints(builder.model, problem, builder.replicas, scale=scale)
        add_capacity_cuts(
            builder.model,
            problem,
            builder.hot,
            builder.replicas,
            fewest=builder.fewest,
            scale=scale,
        )
    # Capacity needs no constraint here: the pool's pooled q90 fits its pods (checked
    # before solving), each hot adapter has replicas enough for its own q90 (min_hot),
    # and stage 2 keeps every pod's pooled q90 within capacity and headroom.
    # Churn: at most K new registrations per pod; pins are an operator's order, exempt.
    if problem.churn_limit is not None and "churn" not in relax:
        for cls in problem.classes:
            if builder.new_regs[cls.key]:
                builder.model.add(sum(builder.new_regs[cls.key]) <= problem.churn_limit * cls.size)
    return builder.finish()


class _Stage1:
    """Adds one adapter's variables, constraints and objective terms at a time."""

    def __init__(self, problem: PoolProblem, *, relax: frozenset[str]) -> None:
        self.problem = problem
        self.relax = relax
        self.model = cp_model.CpModel()
        self.named = named_pins_per_class(problem) if "pins" not in relax else {}
        self.cur_hot = current_per_class(problem, hot_only=True)
        self.cur_reg = current_per_class(problem, hot_only=False)
        self.hot_now = {a for a, _ in problem.current_hot}
        self.hot: dict[str, cp_model.IntVar] = {}
        self.warm: dict[str, cp_model.IntVar] = {}
        self.replicas: dict[ClassKey, cp_model.IntVar] = {}
        self.registered: dict[ClassKey, cp_model.IntVar] = {}
        self.excess: dict[str, tuple[cp_model.IntVar, int, int]] = {}
        #: The fewest replicas each adapter may have when hot.
        self.fewest: dict[str, int] = {}
        self.objective: list[cp_model.LinearExprT] = []
        self.constant = 0.0
        self.new_regs: dict[str, list[cp_model.LinearExprT]] = {
            cls.key: [] for cls in problem.classes
        }

    def add_adapter(self, c: Candidate) -> None:
        model, name = self.model, str(c.name)
        h = self.hot[name] = model.new_bool_var(f"hot[{name}]")
        w = self.warm[name] = model.new_bool_var(f"warm[{name}]")
        # An adapter is in one tier: hot somewhere, warm somewhere, or cold.
        model.add(h + w <= 1)
        min_hot = c.min_hot if "replication" not in self.relax else max(1, len(c.pinned_pods))
        self.fewest[name] = min_hot
        # Pins: a pinned adapter is hot, and on the pods the catalog names.
        if c.pinned and "pins" not in self.relax:
            model.add(h == 1)
        if min_hot > c.max_hot:
            model.add(h == 0)
        per_class_hot, per_class_warm = self._per_class(c)
        # Replication: a hot adapter has between min and max replicas, none when not hot.
        model.add(sum(per_class_hot) >= min_hot * h)
        model.add(sum(per_class_hot) <= c.max_hot * h)
        self._imbalance(c, h, per_class_hot)
        # A warm adapter is registered on exactly one pod; a hot one needs no warm copy.
        model.add(sum(per_class_warm) == w)
        # Misses: every request of a cold adapter pays a storage load, of a warm one a
        # host-to-GPU load. Written as savings against all-cold plus a constant.
        self.constant += c.mean_rps * c.cold_miss_ms
        self.objective.append(-_coef(c.mean_rps * c.cold_miss_ms) * h)
        self.objective.append(-_coef(c.mean_rps * (c.cold_miss_ms - c.warm_miss_ms)) * w)
        # Hysteresis: keeping an adapter hot that is hot now earns a stability credit,
        # so plans do not flap when forecasts move a little (tiering's demote factor).
        if c.name in self.hot_now:
            credit = self.problem.stability * c.mean_rps * c.warm_miss_ms
            self.objective.append(-_coef(credit) * h)
        # Class priority and tenant SLO: a batch or experiment adapter's GPU saving counts
        # at its class weight, so short slots go to production adapters first; a tight
        # TTFT SLO raises the weight (a bonus), a loose one lowers it.
        if c.priority_discount_ms_per_s != 0:
            self.objective.append(_coef(c.priority_discount_ms_per_s) * h)

    def _per_class(self, c: Candidate) -> tuple[list[cp_model.IntVar], list[cp_model.IntVar]]:
        name, hot, warm = str(c.name), [], []
        for cls in self.problem.classes:
            key = (c.name, cls.key)
            top = min(cls.size, c.max_hot) if hot_eligible(c, cls) else 0
            low = min(self.named.get(key, 0), top)
            r = self.model.new_int_var(low, max(low, top), f"rep[{name},{cls.key}]")
            wr = self.model.new_int_var(
                0, 1 if warm_eligible(c, cls) else 0, f"reg[{name},{cls.key}]"
            )
            self.replicas[key], self.registered[key] = r, wr
            hot.append(r)
            warm.append(wr)
            # Loads the plan needs: activations above the hot replicas now in this class,
            # registrations above those now held; they cost once, over the validity.
            validity_s = self.problem.validity_s
            activations = _excess(self.model, r, self.cur_hot.get(key, 0), f"act[{name}]")
            fetches = _excess(self.model, r + wr, self.cur_reg.get(key, 0), f"new[{name}]")
            self.objective.append(_coef(c.activate_ms / validity_s) * activations)
            self.objective.append(_coef(c.fetch_ms / validity_s) * fetches)
            if not c.pinned:
                self.new_regs[cls.key].append(fetches)
        return hot, warm

    def _imbalance(self, c: Candidate, h: cp_model.IntVar, replicas: list[cp_model.IntVar]) -> None:
        """Traffic of a hot adapter that its replicas cannot take without rising above the
        pool's mean pod load: an under-replicated hot spot."""
        pod_mean_rps = self.problem.pod_mean_rps
        if c.mean_rps <= pod_mean_rps:
            return
        mean, pod_mean = round(c.mean_rps * 1000), round(pod_mean_rps * 1000)
        excess = self.model.new_int_var(0, mean, f"excess[{c.name}]")
        self.model.add(excess >= mean * h - pod_mean * sum(replicas))
        self.objective.append(_coef(self.problem.imbalance_weight / 1000) * excess)
        self.excess[str(c.name)] = (excess, mean, pod_mean)

    def finish(self) -> tuple[cp_model.CpModel, ModelVars]:
        self.objective.append(_coef(self.constant))
        self.model.minimize(sum(self.objective))
        return self.model, ModelVars(
            hot=MappingProxyType(self.hot),
            warm=MappingProxyType(self.warm),
            replicas=MappingProxyType(self.replicas),
            registered=MappingProxyType(self.registered),
            excess=MappingProxyType(self.excess),
            constant_ms_per_s=self.constant,
        )


def _coef(ms_per_s: float) -> int:
    return round(ms_per_s * SCALE)


def rounding_slack(problem: PoolProblem, counts: Counts) -> float:
    """How far above a plan's cost (ms/s) stage 1's objective at the plan's ``counts``,
    and so its bound, can be lifted by rounding: each coefficient to 1/SCALE (an
    adapter's four tier terms, two load terms a hot replica, one a warm registration,
    the constant), and the imbalance term's rates to milli-rps (an adapter's mean and the
    pool's mean pod load, once per replica: 2.1333 rps counted as 2.133 lifted a
    two-replica adapter's bound 0.67e-3 ms/s above its plan, found by test_bounds'
    mixed pools)."""
    units = 1 + 4 * len(problem.candidates) + sum(counts.warm.values())
    replicas: dict[str, int] = {}
    for (adapter, _), n in counts.hot.items():
        replicas[adapter] = replicas.get(adapter, 0) + n
    units += 2 * sum(replicas.values())
    per_milli = problem.imbalance_weight / 1000
    coef_error = abs(_coef(per_milli) / SCALE - per_milli)
    imbalance = sum(
        coef_error * round(c.mean_rps * 1000) + per_milli * 0.5 * (1 + replicas[str(c.name)])
        for c in problem.candidates
        if c.mean_rps > problem.pod_mean_rps and replicas.get(str(c.name))
    )
    return units * 0.5 / SCALE + imbalance


def _excess(
    model: cp_model.CpModel, expr: cp_model.LinearExprT, now: int, name: str
) -> cp_model.LinearExprT:
    """``max(0, expr - now)``; with nothing held now that is ``expr`` itself."""
    if now == 0:
        return expr
    excess = model.new_int_var(0, 1 << 20, name)
    model.add(excess >= expr - now)
    return excess


def _add_budgets(
    model: cp_model.CpModel,
    problem: PoolProblem,
    replicas: Mapping[ClassKey, cp_model.IntVar],
    registered: Mapping[ClassKey, cp_model.IntVar],
    *,
    scale: float,
) -> None:
    for cls in problem.classes:
        hot = [(c, replicas[(c.name, cls.key)]) for c in problem.candidates]
        reg = [(c, registered[(c.name, cls.key)]) for c in problem.candidates]
        n = cls.size
        # GPU slots (max_loras) of the class's pods, taken by hot replicas.
        model.add(sum(r for _, r in hot) <= cls.max_loras * n)
        # Host cache places (max_cpu_loras / max-loaded-loras): hot replicas are
        # registered too, so they count alongside warm registrations.
        model.add(sum(r for _, r in hot) + sum(r for _, r in reg) <= cls.max_cpu_loras * n)
        # GPU adapter memory, and host adapter memory for everything registered.
        model.add(sum(c.size_bytes * r for c, r in hot) <= int(cls.hbm_bytes * n * scale))
        host_bytes = sum(c.size_bytes * r for c, r in hot) + sum(c.size_bytes * r for c, r in reg)
        model.add(host_bytes <= int(cls.host_bytes * n * scale))


def add_hint(model: cp_model.CpModel, variables: ModelVars, counts: Counts) -> None:
    hot_names = {a for (a, _), n in counts.hot.items() if n}
    warm_names = {a for (a, _), n in counts.warm.items() if n}
    for name, var in variables.hot.items():
        model.add_hint(var, 1 if name in hot_names else 0)
    for name, var in variables.warm.items():
        model.add_hint(var, 1 if name in warm_names else 0)
    for key, var in variables.replicas.items():
        model.add_hint(var, counts.hot.get(key, 0))
    for key, var in variables.registered.items():
        model.add_hint(var, counts.warm.get(key, 0))
    replicas: dict[str, int] = {}
    for (adapter, _), n in counts.hot.items():
        replicas[adapter] = replicas.get(adapter, 0) + n
    for name, (var, mean, pod_mean) in variables.excess.items():
        hot = 1 if name in hot_names else 0
        model.add_hint(var, max(0, mean * hot - pod_mean * replicas.get(name, 0)))


def counts_from(solver: cp_model.CpSolver, variables: ModelVars) -> Counts:
    hot = {k: int(solver.value(v)) for k, v in variables.replicas.items() if solver.value(v)}
    warm = {k: int(solver.value(v)) for k, v in variables.registered.items() if solver.value(v)}
    return Counts(hot=MappingProxyType(hot), warm=MappingProxyType(warm))


def cp_solver(options: SolveOptions, *, model_size: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    # One worker is deterministic; several race a portfolio, which is deterministic
    # only when the search ends by proof with a unique optimum (CP-SAT's interleaved
    # deterministic mode was tried: on 2,000 adapters it did not improve the hint in 4 s
    # where the portfolio proved optimality in 1 s). Pools under 1,000 adapters prove
    # optimality as fast on one worker (1.1 s either way at 1,000), so they use one and
    # give the same plan every time; larger ones use the workers and stop at the gap.
    # A reproducible search (``SolveOptions.reproducible``) is on one worker whatever its
    # size, and stops by deterministic time.
    large = model_size >= LARGE_POOL_ADAPTERS
    limit(
        solver,
        max(0.05, options.time_limit_s),
        workers=options.workers if large else 1,
        seed=options.seed,
        reproducible=options.reproducible,
    )
    if large:
        solver.parameters.relative_gap_limit = options.gap_limit
    # Repeated presolve turns the byte budgets into hundreds of thousands of clauses:
    # on 5,000 adapters a pool took 14 s to presolve, against 0.5 s with one pass.
    solver.parameters.max_presolve_iterations = 1
    if options.deterministic_time is not None:
        solver.parameters.max_deterministic_time = options.deterministic_time
    return solver


def options_from(
    problem: PlacementProblem, *, time_limit_s: float | None = None, reproducible: bool = False
) -> SolveOptions:
    planner = problem.settings.planner
    return SolveOptions(
        time_limit_s=planner.time_limit_s if time_limit_s is None else time_limit_s,
        workers=planner.workers,
        seed=planner.seed,
        gap_limit=planner.gap_limit,
        reproducible=reproducible,
    )
