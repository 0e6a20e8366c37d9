"""Emulated pods on real sockets and a router in front of them, for the router's tests."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from openai import OpenAI
from prometheus_client import CollectorRegistry

from placement.domain import Adapter, AdapterId, Catalog, Engine, Fleet, PodId, Tier
from placement.emulator import EmulatedFleet, PodConfig, free_base_port, serving_in_thread
from placement.plan import AdapterPlan, Plan, PodPlan
from placement.router import MemoryRequestLog, RouterApp, build_router
from placement.router.sources import PlanSource
from placement.router.wiring import ServedApp
from placement.settings import RouterSettings, Settings

FAST = Settings(
    router=RouterSettings(
        scrape_interval_s=0.05, plan_poll_s=0.05, listing_every_scrapes=4, log_flush_s=0.05
    )
)


def catalog_of(names: Sequence[str], *, base: str = "base-model") -> Catalog:
    return Catalog(
        adapters=tuple(
            Adapter(
                name=AdapterId(name),
                base_model=base,
                rank=8,
                alpha=8.0,
                target_modules=("q_proj", "v_proj"),
                dtype="float16",
                source=f"s3://adapters/{name}",
                size_bytes=50_000_000,
            )
            for name in names
        )
    )


def plan_of(hot: dict[str, list[str]], *, plan_id: str = "plan-1") -> Plan:
    """A plan with ``{adapter: [pods]}`` hot, equal weights."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    pods: dict[PodId, list[AdapterId]] = {}
    adapters = {}
    for name, owners in hot.items():
        share = 1.0 / len(owners)
        adapters[AdapterId(name)] = AdapterPlan(
            tier=Tier.HOT, pods=MappingProxyType({PodId(p): share for p in owners})
        )
        for pod in owners:
            pods.setdefault(PodId(pod), []).append(AdapterId(name))
    return Plan(
        id=plan_id,
        created_at=now,
        valid_from=now,
        valid_until=now + timedelta(hours=1),
        pods=MappingProxyType({p: PodPlan(hot=tuple(a)) for p, a in pods.items()}),
        adapters=MappingProxyType(adapters),
    )


@dataclass
class Pods:
    fleet: EmulatedFleet
    domain: Fleet

    def stats(self, pod: str) -> dict[str, Any]:
        url = next(h.url for h in self.fleet.handles if h.name == pod)
        with urllib.request.urlopen(f"{url}/admin/stats", timeout=5) as answer:
            stats: dict[str, Any] = json.load(answer)
        return stats

    def counter(self, name: str) -> int:
        return sum(int(h.pod.counters[name]) for h in self.fleet.handles)

    def url(self, pod: str) -> str:
        return next(h.url for h in self.fleet.handles if h.name == pod)


@contextlib.contextmanager
def emulated(
    n: int,
    *,
    engine: Engine = Engine.VLLM,
    max_loras: int = 2,
    max_cpu_loras: int = 8,
    **extra: Any,
) -> Iterator[Pods]:
    config = replace(
        PodConfig(), engine=engine, max_loras=max_loras, max_cpu_loras=max_cpu_loras, **extra
    )
    fleet = EmulatedFleet.start(n, engine=engine, base_port=free_base_port(n), config=config)
    with serving_in_thread(fleet.handles):
        yield Pods(fleet=fleet, domain=fleet.domain())


@dataclass
class Running:
    app: RouterApp
    served: ServedApp
    log: MemoryRequestLog
    registry: CollectorRegistry

    @property
    def url(self) -> str:
        return self.served.url

    clients: list[OpenAI] = field(default_factory=list)

    def client(self, **kwargs: Any) -> OpenAI:
        made = OpenAI(base_url=f"{self.url}/v1", api_key="test", max_retries=0, **kwargs)
        self.clients.append(made)
        return made

    def close(self) -> None:
        for made in self.clients:
            made.close()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as answer:
            body = answer.read()
        return json.loads(body) if path != "/metrics" else body.decode()


@contextlib.contextmanager
def router_for(
    fleet: Fleet,
    *,
    plan: Plan | str | Path | PlanSource | None = None,
    catalog: Catalog | None = None,
    settings: Settings = FAST,
) -> Iterator[Running]:
    log = MemoryRequestLog()
    registry = CollectorRegistry()
    app = build_router(
        fleet=fleet,
        plan=plan,
        catalog=catalog,
        settings=settings,
        registry=registry,
        request_log=log,
    )
    with ServedApp(app) as served:
        running = Running(app=app, served=served, log=log, registry=registry)
        try:
            yield running
        finally:
            running.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
