"""A login's preloads go to its tenant's zone: the one zone of the pods the tenant's
adapters are pinned to. Without such a zone, or for a pipeline event, the order is as
before; a pod outside the zone still takes a preload when the zone has no room.
"""

from __future__ import annotations

from dataclasses import replace

from placement.domain import Adapter, AdapterId, Fleet, PodId, TenantId
from placement.forecast.event_preloads import (
    Event,
    EventKind,
    PodView,
    Prediction,
    event_preloads,
)
from tests.factories import adapter, catalog, fleet, pool

ACME = TenantId("acme")


def zoned_fleet(max_loras: int = 2) -> Fleet:
    """p-0 in zone a, p-1 and p-2 in zone b (p-0 sorts first by name)."""
    base = pool("p", 3, max_loras=max_loras, max_cpu_loras=8)
    zones = ("a", "b", "b")
    return fleet(
        replace(base, pods=tuple(replace(p, zone=z) for p, z in zip(base.pods, zones, strict=True)))
    )


def tenant_adapters(*, pinned_to: tuple[str, ...] = ("p-1",)) -> list[Adapter]:
    anchor = replace(adapter("acme-base", tenant="acme"), pinned_pods=tuple(map(PodId, pinned_to)))
    return [anchor, adapter("acme-login", tenant="acme")]


def preload_pod(
    fl: Fleet,
    adapters: list[Adapter],
    *,
    kind: EventKind = EventKind.LOGIN,
    full: frozenset[str] = frozenset(),
) -> str:
    views = {
        pod.name: PodView(
            pod=pod,
            hot=tuple(AdapterId(f"busy-{pod.name}-{i}") for i in range(pod.max_loras))
            if pod.name in full
            else (),
            pinned=frozenset(AdapterId(f"busy-{pod.name}-{i}") for i in range(pod.max_loras))
            if pod.name in full
            else frozenset(),
        )
        for pod in fl.pods
    }
    event = Event(
        kind=kind, id="e1", tenant=ACME, trigger="doc" if kind is EventKind.PIPELINE else None
    )
    decision = event_preloads(
        event,
        (Prediction(adapter=AdapterId("acme-login"), probability=0.9, within_s=300.0),),
        catalog=catalog(*adapters),
        fleet=fl,
        plan=None,
        views=views,
        busy_rps={},
        max_loads=2,
    )
    (pod,) = {str(action.pod) for action in decision.actions}
    return pod


def test_a_login_preloads_in_the_tenants_zone() -> None:
    # p-0 (zone a) has the most room and sorts first; the tenant's zone is b.
    assert preload_pod(zoned_fleet(), tenant_adapters()) in {"p-1", "p-2"}


def test_without_a_tenant_zone_the_order_is_unchanged() -> None:
    # Pinned to pods in both zones: no one zone, so p-0 as before.
    assert preload_pod(zoned_fleet(), tenant_adapters(pinned_to=("p-0", "p-1"))) == "p-0"


def test_a_pipeline_event_ignores_the_zone() -> None:
    assert preload_pod(zoned_fleet(), tenant_adapters(), kind=EventKind.PIPELINE) == "p-0"


def test_a_full_zone_leaves_the_preload_to_another_zone() -> None:
    pod = preload_pod(zoned_fleet(), tenant_adapters(), full=frozenset({"p-1", "p-2"}))
    assert pod == "p-0"
