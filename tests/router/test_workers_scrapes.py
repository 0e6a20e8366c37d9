"""One scrape for all router workers: worker 0 scrapes the pods and publishes what it
learnt; the others apply it instead of reading the pods, and scrape themselves when the
snapshot is stale or unreadable (``router.shared_scrapes``)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.emulator import (
    EmulatedFleet,
    PodConfig,
    listening_sockets,
    ports_of,
    serving_in_thread,
)
from placement.metrics import FleetMetrics
from placement.ports import PodMetrics
from placement.router.live_pods import LivePod, Upstream
from placement.router.metrics import RouterMetrics
from placement.router.scrape_files import (
    SNAPSHOT,
    Listing,
    PodReport,
    Snapshot,
    SnapshotError,
    decode_listings,
    decode_snapshot,
    encode_listings,
    encode_snapshot,
)
from placement.router.scraping import PodScraper
from placement.router.shared_scrapes import ScrapeFollower, ScrapePublisher
from placement.router.workers import share_scrapes
from placement.settings import RouterSettings

from .conftest import MANUAL, Running, catalog_of, router_for
from .processes import start_router, wait_for

ADAPTERS = [f"cold-{i}" for i in range(4)]
#: Every scrape reads the listing too: a test's first round shows what the pod lists.
EVERY_LISTING = replace(MANUAL, router=replace(MANUAL.router, listing_every_scrapes=1))


@dataclass
class Reads:
    """The ``/metrics`` GETs the pods answered: the client's port of each, per pod;
    ``failing``: pods whose ``/metrics`` answers 500."""

    ports: dict[str, list[int]] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, pod: str = "pod-0") -> int:
        with self.lock:
            return len(self.ports.get(pod, []))

    def since(self, pod: str, start: int) -> list[int]:
        with self.lock:
            return list(self.ports.get(pod, [])[start:])


class _CountMetrics:
    def __init__(self, app: Any, *, pod: str, reads: Reads) -> None:
        self.app, self.pod, self.reads = app, pod, reads

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            with self.reads.lock:
                self.reads.ports.setdefault(self.pod, []).append(scope["client"][1])
            if self.pod in self.reads.failing:
                await send({"type": "http.response.start", "status": 500, "headers": []})
                await send({"type": "http.response.body", "body": b"down"})
                return
        await self.app(scope, receive, send)


@dataclass
class CountedPods:
    fleet: EmulatedFleet
    reads: Reads

    @property
    def urls(self) -> dict[str, str]:
        return {h.name: h.url for h in self.fleet.handles}

    def loads(self) -> int:
        return sum(int(h.pod.counters["loads"]) for h in self.fleet.handles)


@contextlib.contextmanager
def counted(n: int) -> Iterator[CountedPods]:
    """``n`` emulated vLLM pods on real sockets that count their ``/metrics`` reads."""
    config = replace(PodConfig(), engine=Engine.VLLM, max_loras=4, max_cpu_loras=8)
    sockets = listening_sockets(n)
    fleet = EmulatedFleet.start(n, engine=Engine.VLLM, ports=ports_of(sockets), config=config)
    reads = Reads()
    for handle in fleet.handles:
        handle.app.add_middleware(_CountMetrics, pod=handle.name, reads=reads)
    with serving_in_thread(fleet.handles, sockets=sockets):
        yield CountedPods(fleet=fleet, reads=reads)


def _complete(url: str, model: str) -> int:
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30.0).status_code


def _pod(worker: Running) -> LivePod:
    return worker.router.topology.pods[PodId("pod-0")]


@contextlib.contextmanager
def _two_workers(tmp_path: Path) -> Iterator[tuple[CountedPods, Running, Running]]:
    """One pod; two routers as worker 0 and worker 1 sharing ``tmp_path``'s scrapes."""
    catalog = catalog_of(ADAPTERS)
    with counted(1) as pods:
        domain = pods.fleet.domain()
        with (
            router_for(domain, catalog=catalog, settings=EVERY_LISTING) as first,
            router_for(domain, catalog=catalog, settings=EVERY_LISTING) as second,
        ):
            share_scrapes(first.app, tmp_path, worker=0)
            share_scrapes(second.app, tmp_path, worker=1)
            yield pods, first, second


def test_the_second_worker_learns_a_pods_listing_and_health_from_the_first(
    tmp_path: Path,
) -> None:
    with _two_workers(tmp_path) as (pods, first, second):
        assert _complete(first.url, "cold-0") == 200
        assert _complete(first.url, "cold-1") == 200
        assert pods.loads() == 2
        assert not _pod(second).ledger.is_listed(AdapterId("cold-1"))
        reads = pods.reads.count()
        first.scrape()
        assert pods.reads.count() == reads + 1
        second.scrape()  # from the snapshot: no read of the pod
        assert pods.reads.count() == reads + 1
        assert _pod(second).ledger.is_listed(AdapterId("cold-1"))
        assert _complete(second.url, "cold-1") == 200
        assert pods.loads() == 2  # it knew the pod holds it: no load, not even "already"

        pods.reads.failing.add("pod-0")
        first.scrape()
        assert not _pod(first).healthy
        second.scrape()
        assert not _pod(second).healthy
        assert pods.reads.count() == reads + 2
        pods.reads.failing.clear()
        first.scrape()
        second.scrape()
        assert _pod(second).healthy and pods.reads.count() == reads + 3


def test_a_second_worker_with_no_snapshot_or_an_unchanged_one_reads_nothing_twice(
    tmp_path: Path,
) -> None:
    with _two_workers(tmp_path) as (pods, first, second):
        reads = pods.reads.count()
        second.scrape()  # nothing published yet: it scrapes the pod itself
        assert pods.reads.count() == reads + 1
        first.scrape()
        second.scrape()
        second.scrape()  # the same snapshot: applied once, nothing read
        assert pods.reads.count() == reads + 2


def test_a_stale_snapshot_makes_a_worker_scrape_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _two_workers(tmp_path) as (pods, first, second):
        first.scrape()
        follower = second.router.scrape_share
        assert isinstance(follower, ScrapeFollower)
        written_s = decode_snapshot((tmp_path / SNAPSHOT).read_bytes()).written_s
        follower.clock = lambda: written_s + follower.stale_after_s + 1.0
        reads = pods.reads.count()
        with caplog.at_level(logging.WARNING, logger="lorafleet.router"):
            second.scrape()
        assert pods.reads.count() == reads + 1
        assert follower.blind
        assert f"{tmp_path / SNAPSHOT} is" in caplog.text and "old" in caplog.text
        follower.clock = time.time
        first.scrape()
        second.scrape()  # current again: back to the snapshot
        assert pods.reads.count() == reads + 2 and not follower.blind


def test_a_round_that_learnt_nothing_new_keeps_the_snapshot_and_moves_its_time(
    tmp_path: Path,
) -> None:
    """An idle pod reports the same figures every round: the scraper keeps the file (and
    its generation) and moves its mtime; a follower stays current on that, reading no
    pod, and decodes again once a report changes."""
    with _two_workers(tmp_path) as (pods, first, second):
        publisher, follower = first.router.scrape_share, second.router.scrape_share
        assert isinstance(publisher, ScrapePublisher) and isinstance(follower, ScrapeFollower)
        path, start_s = tmp_path / SNAPSHOT, time.time()
        publisher.clock = lambda: start_s
        first.scrape()
        first.scrape()  # the listing read in the first round is settled by now
        written = path.stat()
        before = decode_snapshot(path.read_bytes())
        publisher.clock = lambda: start_s + 30.0
        first.scrape()
        kept = path.stat()
        assert (kept.st_ino, kept.st_mtime) == (written.st_ino, start_s + 30.0)
        assert decode_snapshot(path.read_bytes()) == before  # its time inside unchanged
        follower.clock = lambda: start_s + 30.5  # 30 s after the time inside the file
        reads = pods.reads.count()
        second.scrape()
        assert pods.reads.count() == reads and not follower.blind

        pods.reads.failing.add("pod-0")
        first.scrape()
        changed = decode_snapshot(path.read_bytes())
        assert changed.generation == before.generation + 1
        assert path.stat().st_ino != written.st_ino
        second.scrape()
        assert not _pod(second).healthy and pods.reads.count() == reads + 1


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"v":1,"t":"soon","pods":[]}', b'{"v":1,"t":1.0,"pods":[["pod-0"]]}'],
)
def test_a_corrupt_snapshot_is_a_warning_naming_the_file_and_the_worker_scrapes_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: bytes
) -> None:
    with _two_workers(tmp_path) as (pods, _first, second):
        (tmp_path / SNAPSHOT).write_bytes(body)
        reads = pods.reads.count()
        with caplog.at_level(logging.WARNING, logger="lorafleet.router"):
            second.scrape()
        assert pods.reads.count() == reads + 1
        assert _pod(second).healthy
        assert f"{tmp_path / SNAPSHOT} is unreadable" in caplog.text
        assert "Traceback" not in caplog.text


def test_of_two_real_workers_only_one_reads_the_pods_metrics(tmp_path: Path) -> None:
    """The pods see one scraper: the ``/metrics`` reads of a stretch on one connection
    (worker 1 learns from worker 0's snapshot; each worker's scrapes keep one
    connection to a pod)."""
    with counted(2) as pods:
        router = start_router(tmp_path, urls=pods.urls, args=["--workers", "2"])
        try:
            wait_for(lambda: router.get("/readyz").status_code == 200, timeout_s=30, what="ready")
            start = pods.reads.count("pod-0")
            wait_for(
                lambda: pods.reads.count("pod-0") >= start + 24, timeout_s=60, what="24 scrapes"
            )
            ports = Counter(pods.reads.since("pod-0", start)[:24])
            # Without the snapshot the two workers split the reads about evenly. A worker
            # 0 stalled past the snapshot's staleness (2 s: a starved machine) lets the
            # other read a few for itself, which is its fallback working, not a failure.
            ((_, most),) = ports.most_common(1)
            assert most >= 20, f"/metrics read over {len(ports)} connections: {ports}"
        finally:
            router.stop()


# --- the snapshot's form --------------------------------------------------------------

_names = st.frozensets(st.text(min_size=1, max_size=12).map(AdapterId), max_size=4)
_maybe = st.none() | st.integers(min_value=0, max_value=64)
_metrics = st.builds(
    PodMetrics,
    running=st.integers(min_value=0, max_value=10_000),
    waiting=st.integers(min_value=0, max_value=10_000),
    kv_usage=st.floats(min_value=0.0, max_value=1.0),
    running_adapters=_names,
    waiting_adapters=_names,
    max_loras=_maybe,
    lora_slots_used=_maybe,
    lora_slots_total=_maybe,
    healthy=st.booleans(),
)
_listing = st.dictionaries(
    st.text(min_size=1, max_size=12).map(AdapterId), st.text(max_size=20), max_size=6
)


def _scraper() -> PodScraper:
    registry = CollectorRegistry()
    return PodScraper(
        settings=RouterSettings(),
        metrics=RouterMetrics(registry, max_adapter_labels=16),
        fleet_metrics=FleetMetrics(registry),
        clock=time.time,
        http=lambda: pytest.fail("no scrape over HTTP"),
    )


def _live() -> LivePod:
    upstream = Upstream(pod=PodId("pod-0"), pool=PoolId("p"), url="http://pod-0",
                        engine=Engine.VLLM, served_model="base", max_loras=4,
                        max_cpu_loras=8)  # fmt: skip
    return LivePod(upstream)


@given(metrics=_metrics, listing=_listing, sent=st.integers(min_value=0, max_value=5),
       written_s=st.floats(min_value=0, max_value=2e9), seq=st.integers(1, 10**6))  # fmt: skip
def test_a_snapshot_round_trips_what_a_scrape_observed(
    metrics: PodMetrics, listing: dict[AdapterId, str], sent: int, written_s: float, seq: int
) -> None:
    report = PodReport(pod=PodId("pod-0"), url="http://pod-0", fresh=True, healthy=True,
                       why="", metrics_missing=False, metrics=metrics)  # fmt: skip
    snapshot = Snapshot(written_s=written_s, pods=MappingProxyType({report.pod: report}))
    assert decode_snapshot(encode_snapshot(snapshot)) == snapshot
    listings = {report.pod: Listing(seq, MappingProxyType(listing))}
    assert decode_listings(encode_listings(listings)) == listings

    scraped, shared = _live(), _live()
    for state in (scraped, shared):
        for _ in range(sent):  # the worker's own requests in flight stay its own
            state.begin()
    scraped.observe(metrics)
    scraped.ledger.reconcile_listing(listing)
    scraped.sync()
    scraper = _scraper()
    (got,) = decode_snapshot(encode_snapshot(snapshot)).pods.values()
    scraper.take_listing(shared, decode_listings(encode_listings(listings))[report.pod].adapters)
    scraper.take(shared, got)
    for name in ("metrics", "running", "kv_usage", "queue_depth", "running_adapters",
                 "waiting_adapters", "free_slots", "healthy", "inflight"):  # fmt: skip
        assert getattr(shared, name) == getattr(scraped, name), name
    assert set(shared.registered) == set(scraped.registered)


def test_a_router_clock_run_fast_does_not_make_the_snapshot_stale(tmp_path: Path) -> None:
    """``--clock-speed`` runs the router's clock faster than its scrape rounds; the
    snapshot's age is read on the system's clock, so the follower still follows."""
    catalog = catalog_of(ADAPTERS)
    ticks = itertools.count(start=1_800_000_000, step=10**6)  # past any staleness a read
    with counted(1) as pods:
        domain = pods.fleet.domain()
        with (
            router_for(domain, catalog=catalog, settings=EVERY_LISTING) as first,
            router_for(domain, catalog=catalog, settings=EVERY_LISTING) as second,
        ):
            for running in (first, second):
                running.router.clock = lambda: float(next(ticks))
            share_scrapes(first.app, tmp_path, worker=0)
            share_scrapes(second.app, tmp_path, worker=1)
            reads = pods.reads.count()
            first.scrape()
            second.scrape()  # from the snapshot, however far the routers' clock ran
            assert pods.reads.count() == reads + 1


@pytest.mark.parametrize("entry", ["[1]", "[1, {}, 3]", '"x"', "[1, []]", '["1", {}]'])
def test_a_malformed_listing_entry_is_a_snapshot_error_naming_the_pod(entry: str) -> None:
    data = b'{"v": 1, "pods": {"pod-3": ' + entry.encode() + b"}}"
    with pytest.raises(SnapshotError, match="pod pod-3's"):
        decode_listings(data)
