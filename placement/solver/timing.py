"""How long a CP-SAT search may run and how long it took: by the wall clock, or, for a
solve that must give the same plan on any machine however busy (a replay), by CP-SAT's
deterministic time.

Every CP-SAT call of the solver (stage 1, its retries, the exact packing) takes its
limits from ``limit`` and reports what it spent through ``spent_s``, so the budget
arithmetic between them (``placement.solver.solve``) is the same in either mode. A
reproducible search runs on one worker (a portfolio of several is not deterministic)
and stops by deterministic time; its seconds are deterministic seconds converted at
``DETERMINISTIC_PER_S``, so a budget of ``t`` seconds means about ``t`` seconds of one
core. The wall clock still stops it, at ``WALL_GUARD`` times its budget, so that a
model CP-SAT under-counts cannot hang a replay.

Pure: no IO, no clock (CP-SAT measures its own time).
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from placement.clock import Clock

#: CP-SAT's deterministic seconds per second of one core on the solver's models,
#: measured on the war story's overloaded replans (exact packings proven infeasible:
#: 0.04-0.15 deterministic seconds for 0.4-0.84 CPU seconds, one worker).
DETERMINISTIC_PER_S = 0.2
#: A reproducible search stops by the wall clock only past this many times its budget.
WALL_GUARD = 20.0


def limit(
    solver: cp_model.CpSolver,
    time_limit_s: float,
    *,
    workers: int,
    seed: int,
    reproducible: bool,
) -> None:
    """Set ``solver``'s time limit, workers and seed."""
    solver.parameters.random_seed = seed
    if reproducible:
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = time_limit_s * DETERMINISTIC_PER_S
        solver.parameters.max_time_in_seconds = time_limit_s * WALL_GUARD
    else:
        solver.parameters.num_workers = max(1, workers)
        solver.parameters.max_time_in_seconds = time_limit_s


def spent_s(solver: cp_model.CpSolver, *, reproducible: bool) -> float:
    """The seconds a finished search counts against its budget."""
    if reproducible:
        return solver.deterministic_time / DETERMINISTIC_PER_S
    return solver.wall_time


@dataclass(frozen=True, kw_only=True)
class Deadline:
    """When a whole solve must be done, on a monotonic clock the caller gives.

    The caller starts it before it builds the problem (``Deadline.after``), so that the
    building counts too; the solver reads the clock only through it.
    """

    clock: Clock
    end_s: float

    @classmethod
    def after(cls, seconds: float, *, clock: Clock) -> Deadline:
        return cls(clock=clock, end_s=clock() + seconds)

    def left_s(self) -> float:
        return self.end_s - self.clock()
