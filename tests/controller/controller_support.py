"""Helpers shared by the controller tests: a fake clock and small plans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from placement.domain import AdapterId, PodId, Tier
from placement.plan import AdapterPlan, Plan, PodPlan

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


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


def make_plan(
    plan_id: str = "p1",
    *,
    hot: dict[str, tuple[str, ...]] | None = None,
    created: datetime = T0,
) -> Plan:
    """A small plan: per pod its hot adapters, each adapter hot on the pods listing it."""
    hot = hot if hot is not None else {"pod-0": ("a1", "a2"), "pod-1": ("a2",)}
    pods = {
        PodId(pod): PodPlan(hot=tuple(AdapterId(a) for a in names)) for pod, names in hot.items()
    }
    holders: dict[str, list[str]] = {}
    for pod, names in hot.items():
        for name in names:
            holders.setdefault(name, []).append(pod)
    adapters = {
        AdapterId(name): AdapterPlan(
            tier=Tier.HOT,
            pods=MappingProxyType({PodId(p): 1.0 / len(owners) for p in owners}),
        )
        for name, owners in holders.items()
    }
    return Plan(
        id=plan_id,
        created_at=created,
        valid_from=created,
        valid_until=created + timedelta(hours=1),
        pods=MappingProxyType(pods),
        adapters=MappingProxyType(adapters),
    )
