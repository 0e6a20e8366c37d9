"""How many seconds one solve, or one pool of it, has left, and what its steps cost.

Two ways of counting behind one interface, so that ``placement.solver.solve`` asks the
same questions either way:

- **By a deadline** (``Budget.until``: a monotonic clock the caller gives, for a solve
  that is not reproducible, as ``lorafleet plan`` and the controller make). Every
  second counts, Python's too. ``timed`` measures each Python step as it runs (the
  greedy plan, a packing, a top-up, a model's building: the longest of each kind, less
  any CP-SAT search inside it); ``search_s`` gives a CP-SAT search what is left less
  what the steps after it were measured to need, times ``MARGIN``; ``affords`` says
  whether an optional step (a top-up, a wider packing, a retry) still fits.
- **By CP-SAT's seconds** (``Budget.counted``: a reproducible solve, whose plans must
  not depend on how busy the machine is, or a caller that gives no clock). Only what
  CP-SAT reports it spent counts (``charge``: deterministic seconds in a reproducible
  solve), Python is free, every optional step runs and a search gets what it asks for:
  the solver's arithmetic from before deadlines, unchanged.

A deadline solve can still end late by what its last steps take beyond their
estimate: a packing of stage 1's counts (always run: the search reserved room for it)
or a top-up (run only where its estimate fits) and, in a pool whose time has run out,
the greedy plan, which always runs (it is the fallback). ``bench.solver_overload``
prints the wall time against the limit.

Pure but for the clock it is given: no IO. A ``Budget`` keeps what it measured, so one
belongs to one solve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from placement.solver.timing import Deadline

T = TypeVar("T")

#: The steps after a search are reserved this multiple of their longest measured time.
MARGIN = 1.5
#: Before a step has run once in a pool, its cost is guessed as this multiple of the
#: greedy plan's. Measured per pool: ``bench.solver_overload`` seeds 3, 7, 11 (1,000
#: adapters) a greedy 0.03-0.10 s, a model's building 0.05-0.07 s, a packing 0.01-0.14
#: s, a top-up 0.01-0.14 s; ``bench.solver_scale`` 10,000 x 256 (5,000 adapters, a
#: loaded machine) a greedy 1.4-2.6 s, a building 1.1-1.3 s, a top-up 7.2-9.0 s.
GUESS_OVER_GREEDY = {"build": 1.5, "pack": 2.0, "quick_pack": 1.0, "top_up": 4.0}
#: A deadline solve starts no CP-SAT search shorter than this.
MIN_SEARCH_S = 0.05


class Budget:
    """The seconds one solve (or one pool, a ``part``) has left; see the module."""

    def __init__(
        self, limit_s: float, *, deadline: Deadline | None, parent: Budget | None = None
    ) -> None:
        #: The whole of this budget: the shares of a pool's time are of this.
        self.limit_s = limit_s
        #: CP-SAT seconds charged to this budget (what ``SolverReport.wall_s`` reports).
        self.searched_s = 0.0
        self._deadline = deadline
        self._parent = parent
        self._cost_s: dict[str, float] = {}

    @classmethod
    def counted(cls, limit_s: float) -> Budget:
        return cls(limit_s, deadline=None)

    @classmethod
    def until(cls, deadline: Deadline, *, limit_s: float) -> Budget:
        """The deadline or ``limit_s`` from now, whichever comes first."""
        limit_s = min(limit_s, deadline.left_s())
        return cls(limit_s, deadline=Deadline.after(limit_s, clock=deadline.clock))

    @property
    def by_deadline(self) -> bool:
        return self._deadline is not None

    def left_s(self) -> float:
        if self._deadline is None:
            return self.limit_s - self.searched_s
        return self._deadline.left_s()

    def part(self, limit_s: float) -> Budget:
        """``limit_s`` of this budget (a pool's), charged to both."""
        if self._deadline is None:
            return Budget(limit_s, deadline=None, parent=self)
        clock = self._deadline.clock
        end_s = min(self._deadline.end_s, clock() + limit_s)
        return Budget(limit_s, deadline=Deadline(clock=clock, end_s=end_s), parent=self)

    def charge(self, searched_s: float) -> None:
        """Seconds a CP-SAT search spent (``placement.solver.timing.spent_s``)."""
        self.searched_s += searched_s
        if self._parent is not None:
            self._parent.charge(searched_s)

    def timed(self, kind: str, step: Callable[[], T]) -> T:
        """``step()``; by a deadline, its seconds outside CP-SAT kept as ``kind``'s."""
        if self._deadline is None:
            return step()
        clock, searched_s = self._deadline.clock, self.searched_s
        started_s = clock()
        result = step()
        python_s = clock() - started_s - (self.searched_s - searched_s)
        self._cost_s[kind] = max(self._cost_s.get(kind, 0.0), python_s)
        return result

    def need_s(self, *kinds: str) -> float:
        """What steps of these kinds will take, with the margin; 0 when counted."""
        if self._deadline is None:
            return 0.0
        greedy_s = self._cost_s.get("greedy", 0.0)
        guess = {k: GUESS_OVER_GREEDY.get(k, 1.0) * greedy_s for k in kinds}
        return MARGIN * sum(self._cost_s.get(k, guess[k]) for k in kinds)

    def affords(self, *kinds: str) -> bool:
        """Whether steps of these kinds still fit; always, when counted."""
        return self._deadline is None or self.left_s() >= self.need_s(*kinds)

    def search_s(self, wanted_s: float, *, after: tuple[str, ...] = ()) -> float:
        """The seconds a search may take: ``wanted_s``, and by a deadline no more than
        what is left less what the steps ``after`` it need (below ``MIN_SEARCH_S``:
        start none)."""
        if self._deadline is None:
            return wanted_s
        return min(wanted_s, self.left_s() - self.need_s(*after))
