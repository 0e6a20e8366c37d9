"""What router workers share: cold loads claimed (one pod per adapter, whichever
worker asks), and recent rates read as the router's, not one worker's.

With ``--workers N`` each worker routes from its own view: its own requests in flight,
its own loads, the pods' listings as of its last scrape. A worker that sees an adapter
cold decides where to load it from that partial view, so two workers that both see it
cold can choose two pods (each worker's queues differ, and the plan policy spills a load
to a pod it sees less queued): two loads where one worker makes one. The engine's
"already loaded" dedupes two loads of one name on one pod, not loads on two pods.

A claim settles it: the first worker to decide a cold load of an adapter writes the pod
it chose into a small file named after the adapter in a directory the parent created
(``O_CREAT | O_EXCL``: one winner); a worker that then decides a cold load of the same
adapter elsewhere goes to the claimed pod instead, where its load is answered "already
loaded" (or joins the load in flight there) and its ledger learns the adapter. A claim
lasts ``ttl_s``, long enough for every worker's listing of the pod to show the adapter
(after which no worker sees it cold there); an older claim is replaced by the next
worker's choice. A claimed pod that is unhealthy, excluded for this request, under
memory pressure or outside the adapter's pool is not followed.

A worker counts only the requests it routed, about 1/N of the router's, so the recent
rate that caps a victim's forecast (``VictimWorth``) is read N times over
(``FleetRates``): otherwise N workers weigh every victim at 1/N of its worth.

Only a pick that would load cold touches the files (a stat and a read, or a create);
warm picks pass through unchanged. Must not choose pods itself: it only makes the
workers agree on the choice the first of them made.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from placement.clock import Clock
from placement.domain import AdapterId, Outcome, PodId
from placement.router.picking import Choice, Picker
from placement.router.state import LivePod, Topology
from policies.routing import RouteReason, VictimWorth


class LoadClaims:
    """Claims of (adapter -> pod) in ``directory``, shared by the workers of one router."""

    def __init__(self, directory: Path, *, ttl_s: float, clock: Clock = time.time) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self.clock = clock

    def _path(self, adapter: str) -> Path:
        # Adapter names may hold "/" and other characters a file name may not.
        digest = hashlib.blake2b(adapter.encode(), digest_size=16).hexdigest()
        return self.directory / digest

    def claim(self, adapter: str, pod: PodId) -> PodId:
        """Claim ``adapter``'s load for ``pod``; the pod that holds the claim now (``pod``
        unless another worker's claim is younger than ``ttl_s``)."""
        path = self._path(adapter)
        record = f"{pod}\n{self.clock()!r}"
        temporary = self._written(path, record)
        try:
            os.link(temporary, path)  # whole, and only if no claim is there
        except FileExistsError:
            held = self._held(path)
            if held is not None:
                return held
            os.replace(temporary, path)  # a stale claim gives way
            return self._read(path) or pod
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        return pod

    @staticmethod
    def _written(path: Path, record: str) -> Path:
        temporary = path.with_name(f"{path.name}.{os.getpid()}")
        temporary.write_text(record)
        return temporary

    @staticmethod
    def _read(path: Path) -> PodId | None:
        """The pod of the claim there now (of two workers replacing a stale claim at
        once, the last rename wins and both read it back)."""
        try:
            return PodId(path.read_text().partition("\n")[0])
        except FileNotFoundError:
            return None

    def _held(self, path: Path) -> PodId | None:
        """The claim's pod, if the claim is younger than ``ttl_s`` (None: stale or gone)."""
        try:
            pod, _, claimed = path.read_text().partition("\n")
            age_s = self.clock() - float(claimed)
        except (FileNotFoundError, ValueError):
            return None
        return PodId(pod) if pod and age_s < self.ttl_s else None


class FleetRates(Mapping[str, float]):
    """A worker's recent rates as the router's: each worker sees about 1/N of the
    requests (the kernel spreads connections evenly), so N times its own count."""

    __slots__ = ("own", "workers")

    def __init__(self, own: Mapping[str, float], workers: int) -> None:
        self.own = own
        self.workers = workers

    def __getitem__(self, adapter: str) -> float:
        return self.own[adapter] * self.workers

    def get(self, adapter: str, default: float = 0.0) -> float:  # type: ignore[override]
        rate = self.own.get(adapter, None)
        return default if rate is None else rate * self.workers

    def __iter__(self) -> Iterator[str]:
        return iter(self.own)

    def __len__(self) -> int:
        return len(self.own)


class WorkerPicker(Picker):
    """One of ``workers`` workers' ``Picker``: its cold loads follow the workers'
    claims, and a load's victim is weighed by the router's recent rates, not the
    worker's share of them (``FleetRates``)."""

    def __init__(self, picker: Picker, claims: LoadClaims, *, workers: int) -> None:
        # The worker's own picker taken over as it was built (settings, sizes, classes,
        # caches), whatever its constructor takes: no second copy of its arguments here.
        vars(self).update(vars(picker))
        self.claims = claims
        self.workers = workers
        self._scaled: tuple[VictimWorth | None, VictimWorth | None] = (None, None)

    def _victims_for(self, topology: Topology) -> VictimWorth | None:
        victims = super()._victims_for(topology)
        if victims is None or victims.recent_rps is None or self.workers == 1:
            return victims
        own, scaled = self._scaled
        if own is not victims:  # built once per topology, as the victims are
            scaled = replace(victims, recent_rps=FleetRates(victims.recent_rps, self.workers))
            self._scaled = (victims, scaled)
        return scaled

    def pick(
        self, topology: Topology, model: str, *, exclude: frozenset[PodId] = frozenset()
    ) -> Choice:
        choice = super().pick(topology, model, exclude=exclude)
        state = choice.pod
        if state is None or choice.outcome is not Outcome.COLD_LOAD:
            return choice
        if model in state.loading:  # this worker's load in flight: it claimed it
            return choice
        if choice.reason == RouteReason.SPILL:
            choice = self._first_load_by_plan(topology, model, choice, exclude)
            state = choice.pod
            assert state is not None
        held = self.claims.claim(model, PodId(state.pod_id))
        if held == state.pod_id:
            return choice
        other = self._followable(topology, model, held, exclude)
        if other is None:
            return choice
        adapter = AdapterId(model)
        outcome = Outcome.COLD_LOAD if adapter in other.loading else other.ledger.classify(adapter)
        return Choice(other, outcome, reason="claimed", unplanned=choice.unplanned)

    def _first_load_by_plan(
        self, topology: Topology, model: str, choice: Choice, exclude: frozenset[PodId]
    ) -> Choice:
        """A spill of an adapter no pod holds yet goes to the plan's pods instead.

        The plan policy spills a load away from the plan's pods when it sees them more
        queued; a worker sees only its own requests in flight and its own loads, so at
        a cold start it spills on what the other workers happen not to have shown it
        (a pod it sees idle is loading their adapters). Once the adapter is on its
        planned pod, a spill is the policy's own (the claim then makes the workers
        agree on one pod for it)."""
        pool = topology.pool_of(model)
        weights = topology.weights.get(AdapterId(model))
        if pool is None or not weights or pool.index.holders.get(model):
            return choice
        others = frozenset(PodId(s.pod_id) for s in pool.states if s.pod_id not in weights)
        planned = super().pick(topology, model, exclude=exclude | others)
        return planned if planned.pod is not None else choice

    def _followable(
        self, topology: Topology, model: str, pod: PodId, exclude: frozenset[PodId]
    ) -> LivePod | None:
        """The claimed pod, if this request may go there."""
        other = topology.pods.get(pod)
        pool = topology.pool_of(model)
        if other is None or pool is None or not other.healthy or pod in exclude:
            return None
        if other.kv_usage >= self.settings.no_load_kv_usage:
            return None
        return other if other in pool.states else None
