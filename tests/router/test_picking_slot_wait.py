"""The live router prices the wait for a GPU slot (``RouterSettings.price_slot_wait``):
the engines drain nothing for a load, so a load on a full pod whose every slot's adapter
has requests waits until one has none (``policies.route_context.waits_for_slot``).

Both pods below are full and the wanted adapter is cold on both; the pod with an idle
adapter has the longer queue. Priced, the load goes where it can take a slot now;
unpriced, to the shorter queue. "Has requests" is the last scrape's
``lora_requests_info`` or the router's own requests in flight there; a slot an
unloaded name's entry holds idle (the ledger's vLLM ghost) takes a load at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.cli.router_setup import router_settings
from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.metrics import FleetMetrics
from placement.ports import PodMetrics
from placement.router.metrics import RouterMetrics
from placement.router.picking import Picker, slot_taken
from placement.router.scrape_http import HttpxScrapes
from placement.router.scraping import PodScraper
from placement.router.state import LivePod, Topology, Upstream, build_topology
from placement.settings import LoadCostSettings, RouterSettings, Settings
from policies.route_context import waits_for_slot

from .conftest import MANUAL, MetricsOverride, Pods, Running, catalog_of, emulated, router_for

WANTED = "wanted"
#: "taken" holds a and b, "open" holds c and d.
HELD = {"taken": ("a", "b"), "open": ("c", "d")}


def two_full_pods() -> Topology:
    upstreams = tuple(
        Upstream(
            pod=PodId(pod),
            pool=PoolId("pool"),
            url=f"http://127.0.0.1:{port}",
            engine=Engine.VLLM,
            served_model="base-model",
            max_loras=2,
            max_cpu_loras=8,
        )
        for port, pod in enumerate(HELD, start=1)
    )
    topology = build_topology(upstreams, None)
    for pod, names in HELD.items():
        state = topology.pods[PodId(pod)]
        for moment, name in enumerate(names):
            state.ledger.loaded(AdapterId(name), f"/adapters/{name}", changed=True)
            state.note_use(AdapterId(name), float(moment))
    return topology


def names(joined: str) -> frozenset[AdapterId]:
    return frozenset(AdapterId(name) for name in joined.split(",") if name)


def scraped(state: LivePod, *, waiting: int, running: str = "", queued: str = "") -> None:
    """A scrape of ``state``: ``waiting`` requests queued, and the adapters
    ``lora_requests_info`` shows running and waiting (comma-separated)."""
    state.observe(
        PodMetrics(
            running=len(names(running)),
            waiting=waiting,
            running_adapters=names(running),
            waiting_adapters=names(queued),
        )
    )


def chosen(topology: Topology, *, priced: bool) -> str:
    settings = RouterSettings(price_slot_wait=priced)
    choice = Picker(settings=settings, load_cost=LoadCostSettings()).pick(topology, WANTED)
    assert choice.pod is not None
    return choice.pod.pod_id


@pytest.mark.parametrize(("priced", "pod"), [(True, "open"), (False, "taken")], ids=["on", "off"])
def test_a_load_goes_where_the_scrape_shows_an_idle_slot_only_when_priced(
    priced: bool, pod: str
) -> None:
    topology = two_full_pods()
    scraped(topology.pods[PodId("taken")], waiting=1, running="a", queued="b")
    scraped(topology.pods[PodId("open")], waiting=2, running="d", queued="d")
    assert chosen(topology, priced=priced) == pod


@pytest.mark.parametrize(("priced", "pod"), [(True, "open"), (False, "taken")], ids=["on", "off"])
def test_the_routers_own_requests_in_flight_take_slots_the_scrape_shows_idle(
    priced: bool, pod: str
) -> None:
    # The router has just sent requests for a and b; the scrape after it (stale) shows
    # nothing running on "taken", and d busy on "open".
    topology = two_full_pods()
    taken = topology.pods[PodId("taken")]
    for name in ("a", "b"):
        taken.begin(AdapterId(name))
    scraped(taken, waiting=1)
    scraped(topology.pods[PodId("open")], waiting=2, running="d")
    assert chosen(topology, priced=priced) == pod


def test_what_the_scrape_saw_running_of_the_routers_own_and_ended_since_frees_its_slot() -> None:
    # The router sent a and b to "taken"; the scrape saw both there; a's request has
    # ended since (requests are often shorter than a scrape interval), so a's slot takes
    # a load at once. "open" runs c and d, with the shorter queue.
    topology = two_full_pods()
    taken, other = topology.pods[PodId("taken")], topology.pods[PodId("open")]
    held = {name: taken.begin(AdapterId(name)) for name in ("a", "b")}
    scraped(taken, waiting=2, running="a,b")
    scraped(other, waiting=1, running="c,d")
    assert slot_taken(taken), "both of taken's adapters run, by the scrape and the router"
    taken.end(AdapterId("a"), held=held["a"], ran=True)
    assert not slot_taken(taken), "a ended after the scrape: its slot is free to take"
    assert waits_for_slot(taken), "the scrape alone still says a runs"
    assert chosen(topology, priced=True) == "taken"
    scraped(taken, waiting=2, running="a,b")  # a new scrape that shows a again: someone's
    assert slot_taken(taken)


def test_a_request_that_ended_while_its_page_was_read_is_taken_for_ended() -> None:
    # The scraper asked "taken" for its page; a's request ended before the page came
    # back, which still shows a running. Before, observe forgot the end: a read as
    # running, its slot taken, until the scrape after.
    topology = two_full_pods()
    taken, other = topology.pods[PodId("taken")], topology.pods[PodId("open")]
    held = {name: taken.begin(AdapterId(name)) for name in ("a", "b")}
    scraped(other, waiting=1, running="c,d")
    taken.page_asked()
    taken.end(AdapterId("a"), held=held["a"], ran=True)
    scraped(taken, waiting=2, running="a,b")
    assert taken.ended_since_scrape == {"a"}
    assert not slot_taken(taken)
    assert chosen(topology, priced=True) == "taken"
    scraped(taken, waiting=2, running="a,b")  # the next page, asked after a ended: someone's
    assert taken.ended_since_scrape == set() and slot_taken(taken)


def test_an_end_before_the_page_was_asked_for_is_not_carried_to_it() -> None:
    topology = two_full_pods()
    taken = topology.pods[PodId("taken")]
    held = {name: taken.begin(AdapterId(name)) for name in ("a", "b")}
    taken.end(AdapterId("a"), held=held["a"], ran=True)
    taken.page_asked()
    scraped(taken, waiting=2, running="a,b")  # a runs there, and not the router's
    assert taken.ended_since_scrape == set() and slot_taken(taken)


def test_only_the_scrapes_own_adapters_are_remembered_as_ended() -> None:
    topology = two_full_pods()
    taken = topology.pods[PodId("taken")]
    held = {name: taken.begin(AdapterId(name)) for name in ("a", "b", WANTED)}
    scraped(taken, waiting=0, running="a")
    for name, key in held.items():
        taken.end(AdapterId(name), held=key, ran=True)
    assert taken.ended_since_scrape == {"a"}, "b and the rest the scrape did not show"


def test_a_slot_held_by_an_unloaded_names_idle_entry_takes_the_load_at_once() -> None:
    # b unloaded on "taken": its entry keeps the slot (a vLLM ghost), with no request.
    topology = two_full_pods()
    taken = topology.pods[PodId("taken")]
    taken.ledger.forget(AdapterId("b"))
    taken.sync()
    assert taken.free_slots == 0 and list(taken.gpu_adapters) == ["a"], "the set-up"
    scraped(taken, waiting=1, running="a")
    scraped(topology.pods[PodId("open")], waiting=2, running="d")
    assert chosen(topology, priced=True) == "taken"


def test_a_ghost_slot_whose_entry_still_runs_a_request_is_taken() -> None:
    topology = two_full_pods()
    taken = topology.pods[PodId("taken")]
    taken.begin(AdapterId("b"))  # holds b's entry, which stays on its slot when b goes
    taken.ledger.forget(AdapterId("b"))
    taken.sync()
    scraped(taken, waiting=1, running="a")
    scraped(topology.pods[PodId("open")], waiting=2, running="d")
    assert chosen(topology, priced=True) == "open"


def test_it_is_on_by_default_and_the_flag_sets_it() -> None:
    assert RouterSettings().price_slot_wait
    flags = dict(
        policy=None,
        log_flush_s=None,
        log_rotate_bytes=None,
        max_body_bytes=None,
        client_keepalive_s=None,
        class_priority=None,
        adapter_source_template=None,
    )
    assert router_settings(**flags, price_slot_wait=None).router.price_slot_wait
    assert not router_settings(**flags, price_slot_wait=False).router.price_slot_wait


# --- at the wire: emulated vLLM pods, their /metrics as a scrape reads it --------------


def _metrics(*, running: str, waiting: str, queued: int) -> str:
    labels = 'engine="0",model_name="base-model"'
    count = len([n for n in running.split(",") if n])
    info = f'max_lora="2",waiting_lora_adapters="{waiting}",running_lora_adapters="{running}"'
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} {float(count)}\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} {float(queued)}\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.1\n"
        "# TYPE vllm:lora_requests_info gauge\n"
        f"vllm:lora_requests_info{{{info}}} 1.0\n"
    )


@contextlib.contextmanager
def full_pods(*, priced: bool) -> Iterator[tuple[Pods, Running]]:
    """pod-0 holding a and b, pod-1 c and d, each slot's adapter loaded by a request
    through the router (a plan puts them there); then each pod's /metrics says pod-0
    runs a with b queued, pod-1 runs d (c idle) with two queued, and the router
    scrapes it."""
    from .conftest import plan_of

    override = MetricsOverride()
    plan = plan_of({"a": ["pod-0"], "b": ["pod-0"], "c": ["pod-1"], "d": ["pod-1"]})
    settings: Settings = replace(MANUAL, router=replace(MANUAL.router, price_slot_wait=priced))
    catalog = catalog_of(["a", "b", "c", "d", WANTED])
    with (
        emulated(2, max_loras=2, max_cpu_loras=8, metrics_override=override) as pods,
        router_for(pods.domain, plan=plan, catalog=catalog, settings=settings) as router,
    ):
        client = router.client()
        for name in ("a", "b", "c", "d"):
            client.completions.create(model=name, prompt="p", max_tokens=1)
        gpu = {pod: sorted(pods.stats(pod)["gpu"]) for pod in ("pod-0", "pod-1")}
        assert gpu == {"pod-0": ["a", "b"], "pod-1": ["c", "d"]}, "the set-up"
        override.texts["pod-0"] = _metrics(running="a", waiting="b", queued=1)
        override.texts["pod-1"] = _metrics(running="d", waiting="d", queued=2)
        router.scrape()
        yield pods, router


@pytest.mark.parametrize(("priced", "pod"), [(True, "pod-1"), (False, "pod-0")], ids=["on", "off"])
def test_through_the_router_the_load_goes_where_a_slot_is_idle_only_when_priced(
    priced: bool, pod: str
) -> None:
    with full_pods(priced=priced) as (pods, router):
        router.client().completions.create(model=WANTED, prompt="p", max_tokens=1)
        gpu = {name: pods.stats(name)["gpu"] for name in ("pod-0", "pod-1")}
    assert [name for name, held in gpu.items() if WANTED in held] == [pod]


# --- picking.slot_taken on a pod with a vLLM ghost slot ---------------------------------


def _ghost_pod() -> LivePod:
    """One full vLLM pod (2 slots): c's old entry (unloaded: a ghost) and a, both on
    the GPU; the scrape shows a running."""
    topology = build_topology(
        (
            Upstream(
                pod=PodId("ghost"),
                pool=PoolId("pool"),
                url="http://127.0.0.1:1",
                engine=Engine.VLLM,
                served_model="base-model",
                max_loras=2,
                max_cpu_loras=8,
            ),
        ),
        None,
    )
    state = topology.pods[PodId("ghost")]
    state.ledger.loaded(AdapterId("c"), "/adapters/c", changed=True)
    state.note_use(AdapterId("c"), 0.0)
    return state


def test_an_idle_ghost_slot_takes_a_load_now() -> None:
    state = _ghost_pod()
    state.ledger.forget(AdapterId("c"))  # confirmed, then unloaded: its slot stays
    state.ledger.loaded(AdapterId("a"), "/adapters/a", changed=True)
    scraped(state, waiting=0, running="a")
    assert state.free_slots == 0 and state.ledger.residency.ghosts_on_gpu() == 1
    assert waits_for_slot(state), "the scrape alone reads every listed slot running"
    assert not slot_taken(state), "nothing runs on the ghost: a load takes its slot"


def test_a_ghost_slot_a_request_still_runs_on_is_taken() -> None:
    state = _ghost_pod()
    state.begin(AdapterId("c"))  # runs on c's entry, which the unload leaves a ghost
    state.ledger.forget(AdapterId("c"))
    state.ledger.loaded(AdapterId("a"), "/adapters/a", changed=True, busy=state.busy.keys())
    scraped(state, waiting=0, running="a")
    assert state.ledger.residency.ghosts_on_gpu() == 1
    assert slot_taken(state)


# --- the scraper: a request that ends while the pod's page is in flight ----------------


def _scraper(http: httpx.AsyncClient) -> PodScraper:
    """A scraper reading the pods through ``http``, on a registry of its own."""
    registry = CollectorRegistry()
    return PodScraper(
        settings=RouterSettings(),
        metrics=RouterMetrics(registry, max_adapter_labels=16),
        fleet_metrics=FleetMetrics(registry),
        clock=time.time,
        http=lambda: HttpxScrapes(http),
    )


async def _scrape_with_an_end_in_flight() -> LivePod:
    """ "taken" runs the router's a and b; its page (a and b running) is held until a's
    request has ended; what the pod's state reads after the scrape."""
    taken = two_full_pods().pods[PodId("taken")]
    held = {name: taken.begin(AdapterId(name)) for name in ("a", "b")}
    asked, release = asyncio.Event(), asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        asked.set()
        await release.wait()
        return httpx.Response(200, text=_metrics(running="a,b", waiting="", queued=0))

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        scraper = _scraper(http)
        taken.listing_due = False
        scrape = asyncio.create_task(scraper.scrape(taken, listing=False))
        await asyncio.wait_for(asked.wait(), 10.0)  # bounds a broken test, never waited out
        taken.end(AdapterId("a"), held=held["a"], ran=True)
        release.set()
        assert await scrape
    return taken


def test_the_scraper_marks_the_page_asked_so_an_end_in_flight_counts() -> None:
    taken = asyncio.run(_scrape_with_an_end_in_flight())
    assert taken.running_adapters == frozenset({"a", "b"}), "the page was read"
    assert taken.ended_since_scrape == {"a"}  # before: empty, a read as running
    assert not slot_taken(taken)


async def _take_after_a_failed_scrape() -> LivePod:
    """ "taken" runs the router's a and b; its own scrape fails after asking for the page;
    a's request ends; then another worker's page (a and b running) is applied."""
    taken = two_full_pods().pods[PodId("taken")]
    held = {name: taken.begin(AdapterId(name)) for name in ("a", "b")}

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        scraper = _scraper(http)
        taken.listing_due = False
        assert not await scraper.scrape(taken, listing=False)
        taken.end(AdapterId("a"), held=held["a"], ran=True)
        page = PodMetrics(running=2, waiting=0, running_adapters=names("a,b"))
        scraper.take(taken, _Report(page))
    return taken


class _Report:
    """Another worker's fresh scrape of a healthy pod (``scraping.PodReportLike``)."""

    def __init__(self, metrics: PodMetrics) -> None:
        self.metrics = metrics
        self.fresh = True
        self.healthy = True
        self.why = ""
        self.metrics_missing = False


def test_another_workers_page_carries_no_end_even_after_a_failed_own_scrape() -> None:
    # Before, the failed scrape's asking stayed set, and the taken page carried a's end:
    # a read as gone though another worker's page, asked for after, shows it running.
    taken = asyncio.run(_take_after_a_failed_scrape())
    assert taken.running_adapters == frozenset({"a", "b"})
    assert taken.ended_since_scrape == set()
    assert slot_taken(taken)
