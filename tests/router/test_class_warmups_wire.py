"""Production before experiments, at the wire: with ``RouterSettings.class_priority`` a
load on a full emulated vLLM pod whose LRU victim is production, while an experiment
idles beside it, is preceded by a warm-up of the production adapter, so the engine's
LRU evicts the experiment; off, no warm-up is sent and production is evicted. A
warm-up the pod refuses never fails the request."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from placement.domain import AdapterClass, Catalog
from placement.router.core import Router
from placement.router.wiring import adapter_info_from_catalog
from placement.settings import Settings

from .conftest import MANUAL, Pods, Running, catalog_of, emulated, router_for
from .test_endpoint_picker import completion, picker_for

NAMES = ("prod", "exp-a", "exp-b")


def classed_catalog() -> Catalog:
    """ "prod" production, the two others experiments."""
    catalog = catalog_of(NAMES)
    adapters = tuple(
        a if a.name == "prod" else replace(a, adapter_class=AdapterClass.EXPERIMENT)
        for a in catalog.adapters
    )
    return replace(catalog, adapters=adapters)


def _settings(*, on: bool) -> Settings:
    return replace(MANUAL, router=replace(MANUAL.router, class_priority=on))


def _warmups(registry: CollectorRegistry, result: str) -> float:
    value = registry.get_sample_value("lorafleet_class_warmups_total", {"result": result})
    return 0.0 if value is None else value


async def _use_classes_on(router: Router, catalog: Catalog) -> None:
    """The catalog's facts with its classes, as a changed catalog reaches the router
    (``Router.use_adapters``), on the router's own loop. (``build_router`` does not
    give the router the catalog's classes yet: ``adapter_info_from_catalog`` lacks them.)"""
    info = adapter_info_from_catalog(catalog, None)
    classes = {a.name: a.adapter_class.weight for a in catalog.adapters}
    router.use_adapters(replace(info, classes=classes))


@contextlib.contextmanager
def classed_router(*, on: bool) -> Iterator[tuple[Pods, Running]]:
    """One emulated vLLM pod of two GPU slots behind a router that knows the classes."""
    catalog = classed_catalog()
    with (
        emulated(1, max_loras=2, max_cpu_loras=8) as pods,
        router_for(pods.domain, catalog=catalog, settings=_settings(on=on)) as router,
    ):
        router.served.call(_use_classes_on(router.router, catalog))
        yield pods, router


def _fill(pods: Pods, router: Running) -> None:
    """ "prod" then "exp-a" fill the pod: "prod" is the engine's LRU victim."""
    client = router.client()
    for name in ("prod", "exp-a"):
        client.completions.create(model=name, prompt="p", max_tokens=1)
    assert sorted(pods.stats("pod-0")["gpu"]) == ["exp-a", "prod"], "the set-up"


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_production_stays_resident_only_with_class_priority(on: bool) -> None:
    with classed_router(on=on) as (pods, router):
        _fill(pods, router)
        router.client().completions.create(model="exp-b", prompt="p", max_tokens=1)
        gpu = sorted(pods.stats("pod-0")["gpu"])
        requests = pods.counter("requests")
    if on:
        assert gpu == ["exp-b", "prod"], "the experiment idle beside production went"
        assert _warmups(router.registry, "sent") == 1.0
        assert requests == 4, "three requests and one warm-up"
    else:
        assert gpu == ["exp-a", "exp-b"], "the engine's LRU took production"
        assert _warmups(router.registry, "sent") == 0.0
        assert requests == 3, "no warm-up"


def test_a_refused_warm_up_never_fails_the_request() -> None:
    with classed_router(on=True) as (pods, router):
        _fill(pods, router)
        # "prod" unloaded behind the router's back: its ledger still has it idle there,
        # so the warm-up is sent, and the pod answers 404.
        body = json.dumps({"lora_name": "prod"}).encode()
        unload = urllib.request.Request(
            f"{pods.url('pod-0')}/v1/unload_lora_adapter",
            data=body,
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(unload, timeout=5) as answer:
            assert answer.status == 200
        served = router.client().completions.create(model="exp-b", prompt="p", max_tokens=1)
    assert served.choices, "the request was served"
    assert _warmups(router.registry, "failed") == 1.0
    assert _warmups(router.registry, "sent") == 0.0


def test_the_endpoint_picker_sends_the_warm_up_before_it_answers_the_gateway() -> None:
    catalog = classed_catalog()
    with (
        emulated(1, max_loras=2, max_cpu_loras=8) as pods,
        picker_for(pods.domain, catalog=catalog, settings=_settings(on=True)) as picking,
    ):
        picking.served.call(_use_classes_on(picking.router, catalog))
        for name in ("prod", "exp-a"):
            assert picking.send(completion(name)).status == 200
        assert picking.send(completion("exp-b")).status == 200
        gpu = sorted(pods.stats("pod-0")["gpu"])
    assert gpu == ["exp-b", "prod"]
    assert picking.metric("lorafleet_class_warmups_total", result="sent") == 1.0
