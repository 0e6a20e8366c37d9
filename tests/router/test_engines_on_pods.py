"""The router against pods that behave as vLLM and SGLang do (placement.residency inside).

What the router's ledger believes is held against what the emulated engine holds
(``/admin/stats``), and each engine's way of saying "I do not have that adapter", of
running without metrics, and of naming an adapter in a request is met at the wire.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from dataclasses import replace
from typing import Any

import openai
import pytest

from placement.domain import AdapterId, Catalog, Engine, PodId
from placement.residency import EngineModel

from .conftest import MANUAL, Running, catalog_of, emulated, router_for

ADAPTERS = [f"lora-{i}" for i in range(5)]
#: No listing during the test: the ledger must stand on its own.
NO_LISTING = replace(MANUAL, router=replace(MANUAL.router, listing_every_scrapes=10_000))
#: Every other scrape reads /v1/models: two scrapes make one listing.
EVERY_OTHER = replace(MANUAL, router=replace(MANUAL.router, listing_every_scrapes=2))


def _ledger_gpu(router: Running, pod: str = "pod-0") -> list[str]:
    return [str(a) for a in router.router.topology.pods[PodId(pod)].ledger.active()]


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def _load_through_router(router: Running, adapter: str, pod: str = "pod-0") -> None:
    """The router's own on-demand load, without a request after it."""
    core = router.router
    router.served.call(core.load(core.topology.pods[PodId(pod)], AdapterId(adapter)))


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG], ids=["vllm", "sglang"])
def test_the_ledgers_gpu_set_is_the_pods_after_the_router_loads_and_routes(
    engine: Engine,
) -> None:
    with (
        emulated(1, engine=engine, max_loras=2, max_cpu_loras=8) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS), settings=NO_LISTING) as router,
    ):
        client = router.client()
        for name in ["lora-0", "lora-1", "lora-2", "lora-0"]:
            client.completions.create(model=name, prompt="p", max_tokens=1)
            assert _ledger_gpu(router) == pods.stats("pod-0")["gpu"]
        _load_through_router(router, "lora-3")  # a load and nothing else
        gpu = pods.stats("pod-0")["gpu"]
        assert _ledger_gpu(router) == gpu
        if engine is Engine.VLLM:  # every vLLM load takes a GPU slot, evicting the LRU
            assert gpu == ["lora-0", "lora-3"]
        else:  # an SGLang load stays in host memory until a request needs it
            assert gpu == ["lora-2", "lora-0"]


def test_on_vllm_an_unload_behind_the_routers_back_frees_no_slot_in_either() -> None:
    with (
        emulated(1, max_loras=2, max_cpu_loras=8) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS), settings=EVERY_OTHER) as router,
    ):
        client = router.client()
        for name in ["lora-0", "lora-1"]:
            client.completions.create(model=name, prompt="p", max_tokens=1)
        _post(f"{pods.url('pod-0')}/v1/unload_lora_adapter", {"lora_name": "lora-0"})
        router.scrape()
        router.scrape()  # a listing: lora-0 is gone
        stats = pods.stats("pod-0")
        state = router.router.topology.pods[PodId("pod-0")]
        assert _ledger_gpu(router) == stats["gpu"] == ["lora-1"]
        assert state.ledger.residency.ghosts_on_gpu() == stats["ghosts"] == 1
        assert state.free_slots == 0  # the unloaded name's weights still hold their slot


def _metrics_missing(router: Running) -> float | None:
    return router.registry.get_sample_value(
        "lorafleet_router_pod_metrics_missing", {"pod": "pod-0"}
    )


def test_an_sglang_pod_without_enable_metrics_stays_in_rotation_judged_by_health(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        emulated(1, engine=Engine.SGLANG, max_loras=2, sglang_metrics=False) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS), settings=EVERY_OTHER) as router,
    ):
        caplog.set_level(logging.WARNING, logger="lorafleet.router")
        router.scrape()
        router.scrape()
        assert router.get("/healthz")["healthy_pods"] == ["pod-0"]
        answer = router.client().completions.create(model="lora-0", prompt="p", max_tokens=1)
        assert answer.choices
        assert _metrics_missing(router) == 1.0
        warned = [r.getMessage() for r in caplog.records if "--enable-metrics" in r.getMessage()]
        assert len(warned) == 1 and "pod-0" in warned[0]  # one line, naming pod and flag
        pods.fleet.pod("pod-0").kill(3600.0)  # /health answers 503 now
        router.scrape()
        router.scrape()  # /health is asked on listing rounds: the pod leaves
        assert router.get("/healthz")["healthy_pods"] == []


def _answered(client: openai.OpenAI, model: str, *, stream: bool) -> None:
    """A completion for ``model`` answered with choices, whole or streamed."""
    if stream:
        chunks = list(client.completions.create(model=model, prompt="p", max_tokens=3, stream=True))
        assert chunks and all(chunk.choices for chunk in chunks)
    else:
        assert client.completions.create(model=model, prompt="p", max_tokens=1).choices


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("model", "gone"),
    [(EngineModel.SGLANG, "restart"), (EngineModel.SGLANG_HARD_CAP, "unload")],
    ids=["never-been-loaded-after-a-restart", "not-loaded-before-the-soft-cap"],
)
def test_an_adapter_sglang_no_longer_has_is_loaded_again_not_a_400(
    stream: bool, model: EngineModel, gone: str
) -> None:
    # SGLang refuses an adapter it does not serve with 400, or streaming with 200 and an
    # error event (its text depends on the version): the router reads that before
    # forwarding, loads and retries. Since the soft cap only a restart makes the pod forget
    # a name it loaded (an unload keeps it: the next test); before it, an unload does.
    with (
        emulated(1, engine=Engine.SGLANG, max_loras=2, engine_model=model) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS), settings=NO_LISTING) as router,
    ):
        client = router.client()
        client.completions.create(model="lora-0", prompt="p", max_tokens=1)
        if gone == "restart":
            _post(f"{pods.url('pod-0')}/admin/restart", {})
        else:
            _post(f"{pods.url('pod-0')}/unload_lora_adapter", {"lora_name": "lora-0"})
        _answered(client, "lora-0", stream=stream)
        assert pods.counter("loads") == 2
        assert _ledger_gpu(router) == pods.stats("pod-0")["gpu"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_sglang_loads_an_adapter_unloaded_behind_the_routers_back_by_itself(stream: bool) -> None:
    # Since the soft cap an unload leaves the name in the tokenizer manager's
    # lora_ref_cache (sgl-project/sglang tokenizer_control_mixin.py unload_lora_adapter),
    # and _resolve_lora_path loads it again for the next request: the router's forward
    # gets its answer at once, with no load of its own.
    with (
        emulated(1, engine=Engine.SGLANG, max_loras=2) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS), settings=NO_LISTING) as router,
    ):
        client = router.client()
        client.completions.create(model="lora-0", prompt="p", max_tokens=1)
        _post(f"{pods.url('pod-0')}/unload_lora_adapter", {"lora_name": "lora-0"})
        _answered(client, "lora-0", stream=stream)
        assert (pods.counter("loads"), pods.counter("cold_reloads")) == (1, 1)
        assert pods.stats("pod-0")["listed"] == ["lora-0"]
        assert _ledger_gpu(router) == pods.stats("pod-0")["gpu"] == ["lora-0"]


def test_older_sglang_that_reads_only_lora_path_runs_the_adapter() -> None:
    # Before sgl-project/sglang#11570 the engine ignores model "<base>:<adapter>" and would
    # run the base model; the router's lora_path names the adapter for it.
    with (
        emulated(1, engine=Engine.SGLANG, max_loras=2, sglang_model_naming=False) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS)) as router,
    ):
        router.client().completions.create(model="lora-0", prompt="p", max_tokens=1)
        assert pods.stats("pod-0")["gpu"] == ["lora-0"]


def test_sglang_with_dp_size_above_one_refuses_loads_with_what_to_change() -> None:
    with (
        emulated(1, engine=Engine.SGLANG, max_loras=2, sglang_dp_size=2) as pods,
        router_for(pods.domain, catalog=catalog_of(ADAPTERS)) as router,
    ):
        with pytest.raises(openai.APIStatusError) as failure:
            router.client().completions.create(model="lora-0", prompt="p", max_tokens=1)
        assert failure.value.status_code == 502
        assert "--dp-size 1" in str(failure.value)
        assert router.get("/healthz")["healthy_pods"] == ["pod-0"]


@pytest.mark.parametrize("flat", [False, True], ids=["nested-error", "flat-error"])
def test_a_vllm_load_refusal_reaches_the_client_in_the_engines_words(flat: bool) -> None:
    broken = replace(catalog_of(["ghost"]).adapters[0], source="s3://adapters/missing/ghost")
    with (
        emulated(1, vllm_flat_errors=flat) as pods,
        router_for(pods.domain, catalog=Catalog(adapters=(broken,))) as router,
    ):
        with pytest.raises(openai.APIStatusError) as failure:
            router.client().completions.create(model="ghost", prompt="p", max_tokens=1)
        assert failure.value.status_code == 502
        # The engine's message, read out of either body shape (not the JSON body itself):
        words = r": 404 [^{}]*No adapter found for s3://adapters/missing/ghost$"
        assert re.search(words, str(failure.value))
