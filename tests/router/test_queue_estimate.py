"""What the router reads as a pod's queue between two scrapes: the requests it sent
since the last one run in the seats that scrape left free, and only the rest wait
(``LivePod._requeue``), as the engines admit them. Counting every request sent since
the scrape as waiting read a burst to a warm pod as a queue, and the picker spilled the
burst's tail to a cold load on another pod. Each request queued ahead is priced at
the pool's measured wait per request (``PoolIndex.per_request_s``: time in flight over
seats), as the replay prices it, the setting standing in until one is measured."""

from __future__ import annotations

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.ports import PodMetrics
from placement.router.picking import Picker
from placement.router.state import LivePod, Upstream, build_topology
from placement.settings import LoadCostSettings, RouterSettings
from tests import factories

HOT = AdapterId("a0")


def _upstream(index: int) -> Upstream:
    return Upstream(
        pod=PodId(f"pod-{index}"),
        pool=PoolId("pool"),
        url=f"http://pod-{index}.invalid",
        engine=Engine.VLLM,
        served_model="base-model",
        max_loras=2,
        max_cpu_loras=4,
    )


def _send(state: LivePod, count: int) -> None:
    for _ in range(count):
        state.note_use(HOT, 0.0)
        state.begin(HOT)


def test_requests_sent_since_the_scrape_fill_the_free_seats_before_they_wait() -> None:
    state = LivePod(_upstream(0))
    state.observe(PodMetrics(running=8, waiting=3))  # full: the batch holds 8
    assert (state.seats, state.running, state.queue_depth) == (8, 8, 3)
    state.observe(PodMetrics(running=2, waiting=0))
    _send(state, 6)
    assert (state.running, state.queue_depth) == (8, 0)
    _send(state, 2)
    assert (state.running, state.queue_depth) == (8, 2)
    state.end(HOT)
    state.end(HOT)
    state.end(HOT)  # three of the router's requests left: the seats free first
    assert (state.running, state.queue_depth) == (7, 0)


def test_a_pod_with_requests_waiting_admits_none_of_the_new_ones() -> None:
    state = LivePod(_upstream(0))
    state.observe(PodMetrics(running=10, waiting=0))
    state.observe(PodMetrics(running=4, waiting=1))  # full at 4 now (its KV cache, say)
    assert state.seats == 4
    _send(state, 3)
    assert (state.running, state.queue_depth) == (4, 4)


def test_before_the_pod_is_seen_full_its_seats_are_the_most_seen_running() -> None:
    state = LivePod(_upstream(0))
    _send(state, 2)  # no scrape yet: nothing known of its batch, all of them wait
    assert (state.running, state.queue_depth) == (0, 2)
    state.observe(PodMetrics(running=5, waiting=0))
    state.observe(PodMetrics(running=3, waiting=0))
    assert state.seats == 5
    _send(state, 4)
    assert (state.running, state.queue_depth) == (5, 2)


def test_a_burst_to_the_warm_pod_stays_there_while_its_batch_has_seats() -> None:
    """Thirty requests for the plan's hot adapter between two scrapes of a pod seen
    running 32 at once: all go to the pod holding it; none loads it on the idle pod
    beside it (with the old reading, the tail of the burst did)."""
    plan = factories.make_plan({"pod-0": [str(HOT)]})
    topology = build_topology((_upstream(0), _upstream(1)), plan)
    warm, cold = topology.pods[PodId("pod-0")], topology.pods[PodId("pod-1")]
    warm.note_use(HOT, 0.0)
    warm.observe(PodMetrics(running=32, waiting=0))
    warm.observe(PodMetrics(running=1, waiting=0))
    cold.observe(PodMetrics(running=0, waiting=0))
    for view in topology.pools.values():
        view.index.refresh()
    picker = Picker(settings=RouterSettings(), load_cost=LoadCostSettings())
    chosen = []
    for _ in range(30):
        choice = picker.pick(topology, str(HOT))
        assert choice.pod is not None
        chosen.append(choice.pod.pod_id)
        choice.pod.note_use(HOT, 0.0)
        choice.pod.begin(HOT)
    assert set(chosen) == {"pod-0"}


def test_a_seat_frees_every_time_in_flight_over_seats() -> None:
    state = LivePod(_upstream(0))
    assert state.wait_per_request_s() is None  # nothing measured
    state.observe(PodMetrics(running=4, waiting=2))
    assert state.wait_per_request_s() is None  # the seats, not yet the time
    _send(state, 2)
    state.end(HOT, ran=True, took_s=0.4)
    assert state.wait_per_request_s() == 0.4 / 4
    state.end(HOT, ran=True, took_s=1.4)  # a moving average: one request moves it 5%
    assert state.seat_s == 0.4 + 0.05 * (1.4 - 0.4)


def _queued_warm_pod_and_an_idle_one(*, measured: bool) -> str:
    """A warm pod with 20 waiting beside an idle one with a free slot: with the
    setting's 0.05 s per queued request the wait (1 s) costs more than a load on the
    idle pod; at the 0.02 s the warm pod's requests measured, it does not."""
    plan = factories.make_plan({"pod-0": [str(HOT)]})
    topology = build_topology((_upstream(0), _upstream(1)), plan)
    warm, idle = topology.pods[PodId("pod-0")], topology.pods[PodId("pod-1")]
    warm.note_use(HOT, 0.0)
    warm.observe(PodMetrics(running=4, waiting=20))
    idle.observe(PodMetrics(running=0, waiting=0))
    if measured:
        _send(warm, 1)
        warm.end(HOT, ran=True, took_s=0.08)
    for view in topology.pools.values():
        view.index.refresh()
    settings = RouterSettings()
    assert settings.per_request_s == 0.05
    choice = Picker(settings=settings, load_cost=LoadCostSettings()).pick(topology, str(HOT))
    assert choice.pod is not None
    return choice.pod.pod_id


def test_the_picker_prices_a_queue_at_the_pool_s_measured_wait_per_request() -> None:
    assert _queued_warm_pod_and_an_idle_one(measured=True) == "pod-0"


def test_before_any_measurement_the_setting_prices_the_queue() -> None:
    assert _queued_warm_pod_and_an_idle_one(measured=False) == "pod-1"


def test_the_pool_s_wait_is_the_median_of_its_measured_pods() -> None:
    topology = build_topology(tuple(_upstream(i) for i in range(4)), None)
    for i, seat_s in enumerate([0.2, 0.4, 0.8, 0.0]):  # pod-3 measured nothing
        state = topology.pods[PodId(f"pod-{i}")]
        state.observe(PodMetrics(running=4, waiting=1))
        if seat_s:
            _send(state, 1)
            state.end(HOT, ran=True, took_s=seat_s)
    view = topology.pools[PoolId("pool")]
    view.index.refresh()
    assert view.index.per_request_s == 0.4 / 4
