"""``lorafleet router --workers N``: N processes on one port, each with its own state,
agreeing on residency through the pods: a stampede for cold adapters spread over the
workers loads each adapter once per pod."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.adapters.request_log_files import worker_log_path
from placement.domain import AdapterId, PodId, Tier
from placement.plan import AdapterPlan, plan_to_json
from placement.router.load_claims import LoadClaims
from placement.router.workers import share_loads

from .conftest import catalog_of, emulated, plan_of, router_for
from .processes import RouterProcess, start_router, wait_for

ADAPTERS = [f"cold-{i}" for i in range(4)]
CATALOG = "adapters:\n" + "".join(
    f"  - {{name: {name}, base_model: llama-3.1-8b, rank: 8, source: s3://a/{name}}}\n"
    for name in ADAPTERS
)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(part) for part in text.split()]


async def _stampede(url: str, models: list[str]) -> Counter[int]:
    """Every request at once, each on a connection of its own (the kernel hands the
    connections to the workers)."""
    limits = httpx.Limits(max_connections=len(models), max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:

        async def one(model: str) -> int:
            body = {"model": model, "prompt": "hello", "max_tokens": 1}
            reply = await client.post(f"{url}/v1/completions", json=body)
            return reply.status_code

        statuses = await asyncio.gather(*(one(model) for model in models))
    return Counter(statuses)


def _start(tmp_path: Path, urls: dict[str, str], *, workers: int) -> RouterProcess:
    plan = tmp_path / "plan.json"
    hot = {name: [f"pod-{i % len(urls)}"] for i, name in enumerate(ADAPTERS)}
    plan.write_text(plan_to_json(plan_of(hot)))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    args = ["--plan", str(plan), "--catalog", str(catalog), "--workers", str(workers)]
    args += ["--request-log", str(tmp_path / "requests.jsonl"), "--log-flush-s", "0.05"]
    return start_router(tmp_path, urls=urls, args=args)


def test_a_stampede_over_two_workers_loads_a_cold_adapter_once_per_pod(
    tmp_path: Path,
) -> None:
    with emulated(2, max_loras=4, max_cpu_loras=8) as pods:
        router = _start(tmp_path, pods.urls, workers=2)
        try:
            workers = _children(router.pid)
            assert len(workers) == 2
            wait_for(lambda: router.get("/readyz").status_code == 200, timeout_s=30, what="ready")
            statuses = asyncio.run(_stampede(router.url, ["cold-0"] * 100))
            # Both workers asked the planned pod to load it: the second was told
            # "already loaded", which is a success, not a failed request.
            assert statuses == Counter({200: 100})
            assert "cold-0" in pods.stats("pod-0")["listed"]
            # One load per pod, however many workers asked (the policy may still
            # spill to the other pod when the planned one's queue grows long).
            for pod in ("pod-0", "pod-1"):
                assert pods.stats(pod)["counters"].get("loads", 0) <= 1, pod
            assert router.terminate() == 0
            for pid in workers:
                assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
        finally:
            router.stop()
    logs = [worker_log_path(tmp_path / "requests.jsonl", w) for w in range(2)]
    rows = sum(len(path.read_text().splitlines()) for path in logs if path.exists())
    assert rows == 100  # every request logged once, by the worker that served it


def test_the_workers_end_when_their_parent_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL to the parent passes nothing on: the workers end all the same."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the directories it cannot remove
    with emulated(2, max_loras=4, max_cpu_loras=8) as pods:
        router = _start(tmp_path, pods.urls, workers=2)
        try:
            workers = _children(router.pid)
            assert len(workers) == 2
            # Named by the parent's pid, so what it cannot remove can be told apart.
            left = [
                path
                for root in ("/dev/shm", tempfile.gettempdir())
                for path in Path(root).glob(f"lorafleet-*-{router.pid}-*")
            ]
            assert len(left) == 3, left
            router.kill()
            assert not any(path.exists() for path in left)
            wait_for(lambda: all(map(_ended, workers)), timeout_s=30, what="the workers' end")
        finally:
            router.stop()


def _ended(pid: int) -> bool:
    try:
        return _zombie(pid)  # exited, not yet reaped
    except FileNotFoundError:
        return True


def _zombie(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    return "State:\tZ" in status


def test_worker_logs_never_share_a_file() -> None:
    assert worker_log_path(Path("r/requests.jsonl"), 0) == Path("r/requests.jsonl")
    assert worker_log_path(Path("r/requests.jsonl"), 3) == Path("r/requests.w3.jsonl")
    assert worker_log_path(Path("r/log"), 1) == Path("r/log/w1")


def _complete(url: str, model: str) -> int:
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30.0).status_code


def test_a_worker_told_already_loaded_learns_the_pod_from_its_listing() -> None:
    """Two routers over the same pods (two workers' states): the second's load of what
    the first loaded is the engine's "already loaded", no second load; its next scrape
    reads the pod's listing, and so learns what else the first loaded there."""
    catalog = catalog_of(ADAPTERS)
    with (
        emulated(1, max_loras=4, max_cpu_loras=8) as pods,
        router_for(pods.domain, catalog=catalog) as first,
        router_for(pods.domain, catalog=catalog) as second,
    ):
        assert _complete(first.url, "cold-0") == 200
        assert _complete(first.url, "cold-1") == 200
        assert pods.counter("loads") == 2
        assert _complete(second.url, "cold-0") == 200
        assert pods.counter("loads") == 2  # the engine said "already loaded"
        (pod,) = second.router.topology.pods.values()
        assert pod.listing_due
        assert not pod.ledger.is_listed(AdapterId("cold-1"))
        second.scrape()  # not a listing round, but a listing is due
        assert not pod.listing_due
        assert pod.ledger.is_listed(AdapterId("cold-1"))
        assert _complete(second.url, "cold-1") == 200
        assert pods.counter("loads") == 2


# --- claims: the first worker's choice of pod for a cold load holds -----------------


def test_a_claim_is_the_first_workers_pod_until_it_is_stale(tmp_path: Path) -> None:
    now_s = [time.time()]
    claims = LoadClaims(tmp_path, ttl_s=4.0, clock=lambda: now_s[0])
    assert claims.claim("org/cold-0", PodId("pod-1")) == "pod-1"
    assert claims.claim("org/cold-0", PodId("pod-0")) == "pod-1"
    assert claims.claim("cold-1", PodId("pod-0")) == "pod-0"
    now_s[0] += 5.0  # older than two listing periods: every worker's listing shows it
    assert claims.claim("org/cold-0", PodId("pod-0")) == "pod-0"
    assert claims.claim("org/cold-0", PodId("pod-1")) == "pod-0"


def test_a_worker_loads_a_cold_adapter_where_another_worker_claimed_it(
    tmp_path: Path,
) -> None:
    """Two workers' states that would load one adapter on two pods (here they read
    different plans: one polled a newer one): the second follows the first's claim, and
    its load there is the engine's "already loaded"."""
    catalog = catalog_of(ADAPTERS)
    with (
        emulated(2, max_loras=4, max_cpu_loras=8) as pods,
        router_for(pods.domain, plan=plan_of({"cold-0": ["pod-1"]}), catalog=catalog) as first,
        router_for(pods.domain, plan=plan_of({"cold-0": ["pod-0"]}), catalog=catalog) as second,
    ):
        for worker in (first, second):
            share_loads(worker.app, tmp_path, workers=2)
        assert _complete(first.url, "cold-0") == 200
        assert _complete(second.url, "cold-0") == 200
        assert [pods.stats(p)["counters"].get("loads", 0) for p in ("pod-0", "pod-1")] == [0, 1]
        served = [pods.stats(p)["counters"].get("requests", 0) for p in ("pod-0", "pod-1")]
        assert served == [0, 2]
        pod_1 = second.router.topology.pods[PodId("pod-1")]
        assert pod_1.ledger.is_listed(AdapterId("cold-0"))  # told "already loaded"


def test_a_workers_first_load_of_a_planned_adapter_goes_to_its_planned_pod(
    tmp_path: Path,
) -> None:
    """A worker that sees the planned pod busier (its own requests there) would spill
    the first load elsewhere; another worker's view differs, so workers load a cold
    planned adapter where the plan puts it."""
    catalog = catalog_of(ADAPTERS)
    with (
        emulated(2, max_loras=4, max_cpu_loras=8) as pods,
        router_for(pods.domain, plan=plan_of({"cold-0": ["pod-0"]}), catalog=catalog) as one,
    ):
        router = one.router
        planned = router.topology.pods[PodId("pod-0")]
        planned.begin(None)  # a request of this worker's in flight there
        spilled = router.picker.pick(router.topology, "cold-0")
        assert spilled.pod is not None and (spilled.pod.pod_id, spilled.reason) == (
            "pod-1",
            "spill",
        )
        share_loads(one.app, tmp_path, workers=2)
        assert _complete(one.url, "cold-0") == 200
        planned.end(None)
        served = [pods.stats(p)["counters"].get("requests", 0) for p in ("pod-0", "pod-1")]
        assert served == [1, 0]
        assert [pods.stats(p)["counters"].get("loads", 0) for p in ("pod-0", "pod-1")] == [1, 0]


def test_a_workers_victims_are_weighed_by_the_routers_rates_not_its_share(
    tmp_path: Path,
) -> None:
    """Each of N workers counts about 1/N of the requests: the recent rate that caps a
    victim's forecast is read N times over."""
    plan = replace(plan_of({"cold-0": ["pod-0"]}), adapters=MappingProxyType({
        AdapterId("cold-0"): AdapterPlan(
            tier=Tier.HOT, pods=MappingProxyType({PodId("pod-0"): 1.0}), mean_rps=5.0
        )
    }))  # fmt: skip
    with (
        emulated(1, max_loras=4, max_cpu_loras=8) as pods,
        router_for(pods.domain, plan=plan, catalog=catalog_of(ADAPTERS)) as one,
    ):
        assert _complete(one.url, "cold-0") == 200
        assert _complete(one.url, "cold-0") == 200
        topology = one.router.topology
        own = topology.recent.get("cold-0")
        assert own > 0.0
        share_loads(one.app, tmp_path, workers=3)
        victims = one.router.picker._victims_for(topology)
        assert victims is not None and victims.recent_rps is not None
        assert victims.recent_rps.get("cold-0") == pytest.approx(3 * own)
        assert victims.recent_rps["cold-0"] == pytest.approx(3 * own)
        assert victims.recent_rps.get("cold-1", -1.0) == -1.0
        assert list(victims.recent_rps) == ["cold-0"]


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "org/a"]),
            st.sampled_from(["pod-0", "pod-1", "pod-2"]),
            st.floats(min_value=0.0, max_value=3.0),
        ),
        max_size=30,
    )
)
def test_claims_agree_on_the_first_pod_until_it_is_stale(
    steps: list[tuple[str, str, float]],
) -> None:
    """Whatever the workers ask and when: a claim answers the pod of the last claim
    made while none was fresh, and a claim older than its ttl gives way."""
    with tempfile.TemporaryDirectory() as directory:
        now_s = [1000.0]
        claims = LoadClaims(Path(directory), ttl_s=4.0, clock=lambda: now_s[0])
        held: dict[str, tuple[str, float]] = {}
        for adapter, pod, wait_s in steps:
            now_s[0] += wait_s
            first = held.get(adapter)
            if first is None or now_s[0] - first[1] >= 4.0:
                first = held[adapter] = (pod, now_s[0])
            assert claims.claim(adapter, PodId(pod)) == first[0]


def test_of_two_workers_only_the_first_records_the_pods_residency(tmp_path: Path) -> None:
    """Every worker sees the same adapters come and go on the pods; ``/metrics`` sums the
    workers' eviction counters, so one worker alone records stays and evictions."""
    catalog = catalog_of(ADAPTERS)
    plan = plan_of({"cold-0": ["pod-0"]})
    with (
        emulated(1, max_loras=4, max_cpu_loras=8) as pods,
        router_for(pods.domain, plan=plan, catalog=catalog) as first,
        router_for(pods.domain, plan=plan, catalog=catalog) as second,
    ):
        share_loads(first.app, tmp_path, workers=2, worker=0)
        share_loads(second.app, tmp_path, workers=2, worker=1)
        for worker in (first, second):  # the second is told "already loaded"
            assert _complete(worker.url, "cold-0") == 200
        for worker in (first, second):
            assert worker.router.topology.pods[PodId("pod-0")].ledger.is_listed(AdapterId("cold-0"))
            worker.scrape()
        stays = [w.router.fleet_metrics._since_s for w in (first, second)]
        assert stays == [{("pod-0", "cold-0"): stays[0][("pod-0", "cold-0")]}, {}]
        gauge = "lorafleet_pod_gpu_adapters"
        assert first.registry.get_sample_value(gauge, {"pod": "pod-0"}) == 1
        assert second.registry.get_sample_value(gauge, {"pod": "pod-0"}) is None
