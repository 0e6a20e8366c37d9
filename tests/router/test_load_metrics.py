"""The router's load timing, request queue time and load queue, at the wire (emulated
pods on real sockets, the router's own ``/metrics`` registry)."""

from __future__ import annotations

import json
import urllib.request

from .conftest import Running, catalog_of, emulated, plan_of, router_for

ADAPTERS = ["alpha", "beta"]


def value(router: Running, name: str, **labels: str) -> float:
    got = router.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_a_cold_load_is_timed_from_storage_and_its_request_queued_on_it() -> None:
    with emulated(1) as pods:
        plan = plan_of({"alpha": ["pod-0"]})
        with router_for(pods.domain, plan=plan, catalog=catalog_of(ADAPTERS)) as router:
            for _ in range(3):
                router.client().completions.create(model="alpha", prompt="a", max_tokens=1)
            load = "lorafleet_adapter_load_seconds"
            for stage in ("queued", "loading", "total"):
                assert value(router, f"{load}_count", source="storage", stage=stage) == 1
            assert value(router, f"{load}_count", source="host", stage="total") == 0
            total = value(router, f"{load}_sum", source="storage", stage="total")
            parts = sum(
                value(router, f"{load}_sum", source="storage", stage=stage)
                for stage in ("queued", "loading")
            )
            assert total > 0 and abs(total - parts) < 1e-9
            queue = "lorafleet_request_queue_seconds_count"
            # The first request waited on the load; the next two found alpha loaded.
            assert value(router, queue, cause="load") == 1
            assert value(router, queue, cause="none") == 2
            assert value(router, queue, cause="pressure") == 0
            # The load queue was set when the load began and is empty again.
            depth = router.registry.get_sample_value("lorafleet_load_queue_depth", {"pod": "pod-0"})
            assert depth == 0


def test_a_load_the_pod_already_had_is_from_host() -> None:
    with emulated(1) as pods:
        plan = plan_of({"beta": ["pod-0"]})
        with router_for(pods.domain, plan=plan, catalog=catalog_of(ADAPTERS)) as router:
            # Someone else (the controller, another router worker) loads beta after the
            # router's first listing: the router's load is answered "already loaded".
            body = json.dumps({"lora_name": "beta", "lora_path": "s3://adapters/beta"}).encode()
            request = urllib.request.Request(
                pods.url("pod-0") + "/v1/load_lora_adapter",
                data=body,
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=5) as answer:
                assert answer.status == 200
            router.client().completions.create(model="beta", prompt="a", max_tokens=1)
            load = "lorafleet_adapter_load_seconds_count"
            assert value(router, load, source="host", stage="total") == 1
            assert value(router, load, source="storage", stage="total") == 0


def test_requests_that_need_no_adapter_wait_for_nothing() -> None:
    with emulated(2) as pods, router_for(pods.domain, plan=None) as router:
        for _ in range(2):
            router.client().completions.create(model="base-model", prompt="a", max_tokens=1)
        assert value(router, "lorafleet_request_queue_seconds_count", cause="none") == 2
        loads = value(
            router, "lorafleet_adapter_load_seconds_count", source="storage", stage="total"
        )
        assert loads == 0
