"""Class warm-ups in the replay engine: a route's ``refresh`` is sent to its pod as real
requests, ahead of the request: each takes a batch place, refreshes its adapter's LRU
place (so the load behind it evicts another) and is counted; none ever loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from placement.domain import Action
from placement.forecast.event_preloads import Event
from placement.settings import LoadCostSettings, SimSettings
from placement.sim.engine import WARMUP_TOKENS, FleetReplay
from placement.sim.pods import PodSpec
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy
from policies.routing import RouteDecision, RouteReason

START = datetime(2026, 3, 10, tzinfo=UTC)


@dataclass
class Scripted:
    """Every request to pod-0; the request at ``refresh_at`` carries ``refresh``."""

    refresh_at: float
    refresh: tuple[str, ...]
    eviction: EvictionPolicy = EvictionPolicy.LRU
    seen: list[float] = field(default_factory=list)

    def route(self, adapter: str, now_s: float) -> RouteDecision:
        refresh = self.refresh if now_s == self.refresh_at else ()
        return RouteDecision("pod-0", RouteReason.LOAD, refresh=refresh)

    def observe(self, adapter: str, now_s: float) -> bool:
        self.seen.append(now_s)
        return False

    def plan(self, now_s: float, replay: FleetReplay) -> dict[str, frozenset[str]] | None:
        return None

    def on_event(self, event: Event, now_s: float, replay: FleetReplay) -> tuple[Action, ...]:
        return ()


def two_slot_replay(arrivals: list[tuple[float, str]]) -> FleetReplay:
    load = SimWorkload(
        start=START,
        arrival_s=[moment for moment, _ in arrivals],
        adapters=[name for _, name in arrivals],
        prompt_tokens=[100] * len(arrivals),
        output_tokens=[5] * len(arrivals),
        size_bytes=dict.fromkeys({name for _, name in arrivals}, 50_000_000),
    )
    spec = PodSpec(pod_id="pod-0", max_loras=2, max_cpu_loras=4)
    return FleetReplay(load, [spec], sim=SimSettings(), load_cost=LoadCostSettings())


# "prod" is used first, then "batch": "prod" is the LRU victim when "new" arrives.
ARRIVALS = [(0.0, "prod"), (5.0, "batch"), (10.0, "new")]


def test_a_warm_up_moves_the_victim_to_the_lower_class() -> None:
    replay = two_slot_replay(ARRIVALS)
    log = replay.run(Scripted(refresh_at=10.0, refresh=("prod",)))
    pod = replay.pods[0]
    assert set(pod.gpu_adapters) == {"prod", "new"}
    assert log.warmups == 1
    assert len(log.loads) == 3  # prod, batch, new: the warm-up loaded nothing
    assert pod.agrees()


def test_without_the_warm_up_the_lru_victim_goes() -> None:
    replay = two_slot_replay(ARRIVALS)
    log = replay.run(Scripted(refresh_at=-1.0, refresh=()))
    assert set(replay.pods[0].gpu_adapters) == {"batch", "new"}
    assert log.warmups == 0


def test_a_warm_up_takes_pod_time_before_the_request_behind_it() -> None:
    # "prod" and "batch" are resident; at 10 s a request for "batch" carries a warm-up
    # of "prod": the warm-up runs first, and its adapter's last use is its time.
    arrivals = [(0.0, "prod"), (5.0, "batch"), (10.0, "batch")]
    replay = two_slot_replay(arrivals)
    log = replay.run(Scripted(refresh_at=10.0, refresh=("prod",)))
    pod = replay.pods[0]
    assert log.warmups == 1
    assert pod.last_used["prod"] == 10.0
    assert list(pod.gpu_adapters) == ["prod", "batch"]  # batch used after the warm-up
    sim = SimSettings()
    assert WARMUP_TOKENS[0] * sim.prefill_ms_per_token > 0.0
    assert pod.busy_until > 10.0


def test_a_warm_up_whose_adapter_left_the_gpu_is_dropped_not_loaded() -> None:
    # The warm-up names "gone", which is not on the pod: nothing is sent, nothing loads.
    replay = two_slot_replay(ARRIVALS)
    log = replay.run(Scripted(refresh_at=10.0, refresh=("gone",)))
    assert log.warmups == 0
    assert len(log.loads) == 3
    assert "gone" not in replay.pods[0].gpu_adapters


@dataclass
class TwoWarmups(Scripted):
    """Like ``Scripted``, with the warm-up on every request at the given moments."""

    moments: tuple[float, ...] = ()

    def route(self, adapter: str, now_s: float) -> RouteDecision:
        refresh = self.refresh if now_s in self.moments else ()
        return RouteDecision("pod-0", RouteReason.LOAD, refresh=refresh)


def test_two_warm_ups_of_one_adapter_queued_at_once_are_both_sent() -> None:
    # A long "batch" request fills the one-place batch; two requests behind it each
    # queue a warm-up of "prod". Both are warm-ups (a set had kept one name, and the
    # second entry was read as a plan's preload and dropped).
    arrivals = [(0.0, "prod"), (1.0, "batch"), (2.0, "batch"), (2.5, "batch")]
    load = SimWorkload(
        start=START,
        arrival_s=[moment for moment, _ in arrivals],
        adapters=[name for _, name in arrivals],
        prompt_tokens=[100] * len(arrivals),
        output_tokens=[5, 2_000, 5, 5],
        size_bytes={"prod": 50_000_000, "batch": 50_000_000},
    )
    spec = PodSpec(pod_id="pod-0", max_loras=2, max_cpu_loras=4)
    sim = SimSettings(max_num_seqs=1)
    replay = FleetReplay(load, [spec], sim=sim, load_cost=LoadCostSettings())
    log = replay.run(TwoWarmups(refresh_at=-1.0, refresh=("prod",), moments=(2.0, 2.5)))
    assert log.warmups == 2
    assert replay.pods[0].warmups == {}
    assert len(log.loads) == 2
