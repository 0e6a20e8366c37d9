"""The emulated pods speak POD-API.md exactly, hold what the engine model says, and fail on
demand. The engine semantics every pod must keep are in ``test_contract_*.py``; these are the
emulator's own: exact bodies, version knobs, timing-free residency counters, faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from starlette.requests import ClientDisconnect
from typer.testing import CliRunner

from placement.adapters.metrics_text import parse_vllm_metrics
from placement.cli.app import app
from placement.clock import ManualClock
from placement.domain import Engine
from placement.emulator import (
    ZERO_LATENCY,
    EmulatedFleet,
    EmulatedPod,
    PodConfig,
    build_pod,
    listening_sockets,
    ports_of,
    serve_fleet,
)
from placement.emulator.vllm_app import create_vllm_app
from placement.emulator.wire import pod_stats
from placement.residency import EngineModel

from .conftest import EmulatedFactory

pytestmark = pytest.mark.anyio

URL = "http://127.0.0.1:18000"


def _vllm_error(
    status: int, message: str, kind: str, param: str | None = None
) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


async def _post(http: httpx.AsyncClient, path: str, body: Mapping[str, object]) -> httpx.Response:
    return await http.post(URL + path, json=body)


VLLM_ANSWERS = [
    pytest.param(
        "/v1/load_lora_adapter",
        {"lora_name": "a"},
        400,
        _vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput"),
        id="load-missing-path",
    ),
    pytest.param(
        "/v1/load_lora_adapter",
        {"lora_name": "b", "lora_path": "s3://x/missing-b"},
        404,
        _vllm_error(
            404,
            "Call to add_lora method failed: Loading lora b failed: No adapter found for "
            "s3://x/missing-b",
            "NotFoundError",
        ),
        id="load-bad-path",
    ),
    pytest.param(
        "/v1/load_lora_adapter",
        {"lora_name": "a", "lora_path": "s3://x/a"},
        400,
        _vllm_error(
            400,
            "The lora adapter 'a' has already been loaded. If you want to load the adapter in "
            "place, set 'load_inplace' to True.",
            "InvalidUserInput",
        ),
        id="load-twice",
    ),
    pytest.param(
        "/v1/unload_lora_adapter",
        {},
        400,
        _vllm_error(
            400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput"
        ),
        id="unload-no-name",
    ),
    pytest.param(
        "/v1/unload_lora_adapter",
        {"lora_name": "zz"},
        404,
        _vllm_error(404, "The lora adapter 'zz' cannot be found.", "NotFoundError"),
        id="unload-absent",
    ),
    pytest.param(
        "/v1/completions",
        {"model": "zz", "prompt": "hi"},
        404,
        _vllm_error(404, "The model `zz` does not exist.", "NotFoundError", "model"),
        id="unknown-model",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "answer"), VLLM_ANSWERS)
async def test_vllm_errors_are_exact(
    emulated: EmulatedFactory, path: str, body: dict[str, object], status: int, answer: object
) -> None:
    async with emulated(1).http() as http:
        await _post(http, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "s3://x/a"})
        response = await _post(http, path, body)
    assert (response.status_code, response.json()) == (status, answer)


async def test_vllm_success_texts(emulated: EmulatedFactory) -> None:
    async with emulated(1).http() as http:
        loaded = await _post(http, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "p"})
        removed = await _post(http, "/v1/unload_lora_adapter", {"lora_name": "a"})
    assert loaded.text == "Success: LoRA adapter 'a' added successfully."
    assert removed.text == "Success: LoRA adapter 'a' removed successfully."


async def test_vllm_without_runtime_updating_answers_fastapi_404(emulated: EmulatedFactory) -> None:
    async with emulated(1, runtime_lora_updating=False).http() as http:
        response = await _post(http, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "p"})
    assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})


async def test_vllm_lists_evicted_registrations_and_reloads_them(emulated: EmulatedFactory) -> None:
    fleet = emulated(1, max_loras=1, max_cpu_loras=2)
    async with fleet.http() as http:
        for name in ("a", "b", "c"):
            await _post(
                http, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": f"p/{name}"}
            )
        listed = [card["id"] for card in (await http.get(URL + "/v1/models")).json()["data"]]
        await _post(http, "/v1/completions", {"model": "a", "prompt": "x", "max_tokens": 1})
    stats = pod_stats(fleet.handles[0].pod)
    assert listed == ["base-model", "a", "b", "c"]
    assert stats["counters"]["host_evictions"] >= 2  # c evicted a; reloading a evicted b
    assert stats["counters"]["cold_reloads"] == 1
    assert stats["counters"]["over_limit"] == 1
    assert stats["host"] == ["c", "a"]


async def test_alternating_adapters_on_one_slot_thrash(emulated: EmulatedFactory) -> None:
    fleet = emulated(1, max_loras=1, max_cpu_loras=2)
    async with fleet.http() as http:
        for name in ("a", "b"):
            await _post(http, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": name})
        for name in ("a", "b", "a", "b", "b"):
            await _post(http, "/v1/completions", {"model": name, "prompt": "x", "max_tokens": 1})
    stats = pod_stats(fleet.handles[0].pod)
    counters = stats["counters"]
    # each load activates (b pushes a off), then a, b, a, b swap in turn and b stays
    assert (counters["gpu_activations"], counters["gpu_evictions"]) == (6, 5)
    residency = stats["residency_s"]
    # every eviction ended one residency; the adapter still on the slot is ongoing
    assert (len(residency["ended"]), len(residency["ongoing"])) == (5, 1)
    assert all(seconds >= 0 for seconds in residency["ended"])


async def test_concurrent_loads_of_one_name_are_serialised(emulated: EmulatedFactory) -> None:
    fleet = emulated(1)
    async with fleet.http() as http:
        body = {"lora_name": "a", "lora_path": "p"}
        answers = await asyncio.gather(
            *(_post(http, "/v1/load_lora_adapter", body) for _ in range(4))
        )
    assert sorted(response.status_code for response in answers) == [200, 400, 400, 400]


async def test_metrics_show_adapters_in_flight(emulated: EmulatedFactory) -> None:
    fleet = emulated(1, max_loras=2)
    pod = fleet.handles[0].pod
    async with fleet.http() as http:
        await _post(http, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "p"})
        await pod.admit("a")
        metrics = parse_vllm_metrics((await http.get(URL + "/metrics")).text)
        await pod.release("a")
        after = parse_vllm_metrics((await http.get(URL + "/metrics")).text)
    assert (metrics.running, metrics.max_loras) == (1, 2)
    assert metrics.running_adapters == frozenset({"a"})
    assert (after.running, after.running_adapters) == (0, frozenset())


async def test_local_paths_must_exist_and_carry_their_rank(
    emulated: EmulatedFactory, tmp_path: Path
) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 64}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"0" * 1000)
    async with emulated(1, engine=Engine.SGLANG, max_loras=2, max_cpu_loras=4).http() as http:
        too_big = await _post(
            http, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path)}
        )
        absent = await _post(
            http, "/load_lora_adapter", {"lora_name": "b", "lora_path": str(tmp_path / "no")}
        )
    assert "with rank 64 is incompatible" in too_big.json()["error_message"]
    assert absent.status_code == 400
    assert str(tmp_path / "no") in absent.json()["error_message"]


SGLANG = dict(engine=Engine.SGLANG, max_loras=2, max_cpu_loras=2)


async def test_sglang_lora_answers(emulated: EmulatedFactory) -> None:
    async with emulated(1, **SGLANG).http() as http:
        loaded = await _post(http, "/load_lora_adapter", {"lora_name": "a", "lora_path": "p"})
        twice = await _post(http, "/load_lora_adapter", {"lora_name": "a", "lora_path": "p"})
        absent = await _post(http, "/unload_lora_adapter", {"lora_name": "zz"})
    assert (loaded.status_code, loaded.json()) == (
        200,
        {"success": True, "error_message": "", "loaded_adapters": {"a": "p"}},
    )
    assert (twice.status_code, twice.json()["error_message"]) == (
        400,
        "Failed to load LoRA adapter a because it is already loaded",
    )
    assert absent.json() == {
        "success": False,
        "error_message": "LoRA with name zz does not exist. Loaded LoRAs: odict_keys(['a'])",
        "loaded_adapters": {"a": "p"},
    }


async def test_sglang_soft_cap_lets_a_load_past_it_and_unlists_the_lru(
    emulated: EmulatedFactory,
) -> None:
    fleet = emulated(1, **SGLANG)
    async with fleet.http() as http:
        for name in ("a", "b", "c"):
            await _post(http, "/load_lora_adapter", {"lora_name": name, "lora_path": name})
        stats = (await http.get(URL + "/admin/stats")).json()
        parked_unload = await _post(http, "/unload_lora_adapter", {"lora_name": "a"})
        again = await _post(http, "/v1/completions", {"model": "base-model:a", "prompt": "x"})
        after = (await http.get(URL + "/admin/stats")).json()
    assert (stats["listed"], stats["parked"]) == (["b", "c"], ["a"])
    # the soft cap's victim is no longer registered: an unload does not find it
    assert parked_unload.json()["error_message"] == (
        "LoRA with name a does not exist. Loaded LoRAs: odict_keys(['b', 'c'])"
    )
    assert again.status_code == 200 and (after["listed"], after["parked"]) == (["c", "a"], ["b"])
    assert (after["counters"]["unlisted"], after["counters"]["cold_reloads"]) == (2, 1)


async def test_sglang_before_the_soft_cap_refuses_a_load_past_it(
    emulated: EmulatedFactory,
) -> None:
    async with emulated(1, **SGLANG, engine_model=EngineModel.SGLANG_HARD_CAP).http() as http:
        for name in ("a", "b"):
            await _post(http, "/load_lora_adapter", {"lora_name": name, "lora_path": name})
        full = await _post(http, "/load_lora_adapter", {"lora_name": "c", "lora_path": "c"})
    assert full.status_code == 400
    assert "Maximum number of loaded LoRA adapters is 2" in full.json()["error_message"]


COMPLETION = {"prompt": "x", "max_tokens": 1}


@pytest.mark.parametrize(
    ("naming", "body", "runs"),
    [
        pytest.param(True, {"model": "base-model:a"}, "a", id="new-model-colon"),
        pytest.param(True, {"model": "base-model", "lora_path": "a"}, "a", id="new-lora-path"),
        pytest.param(True, {"model": "a"}, None, id="new-bare-name-runs-the-base"),
        pytest.param(False, {"model": "base-model:a"}, None, id="old-ignores-model"),
        pytest.param(False, {"model": "base-model:a", "lora_path": "a"}, "a", id="old-lora-path"),
    ],
)
async def test_sglang_request_naming_by_engine_version(
    emulated: EmulatedFactory, naming: bool, body: dict[str, str], runs: str | None
) -> None:
    fleet = emulated(1, **SGLANG, sglang_model_naming=naming)
    async with fleet.http() as http:
        await _post(http, "/load_lora_adapter", {"lora_name": "a", "lora_path": "a"})
        answer = await _post(http, "/v1/completions", {**body, **COMPLETION})
    assert answer.status_code == 200
    assert pod_stats(fleet.handles[0].pod)["gpu"] == ([runs] if runs else [])


@pytest.mark.parametrize(
    ("model", "text"),
    [
        pytest.param(
            EngineModel.SGLANG,
            "Got LoRA adapter that has never been loaded: zz\n"
            "All loaded adapters: dict_keys(['a']).",
            id="soft-cap",
        ),
        pytest.param(
            EngineModel.SGLANG_HARD_CAP,
            "The following requested LoRA adapters are not loaded: zz\n"
            "Loaded adapters: dict_keys(['a']).",
            id="before-the-soft-cap",
        ),
    ],
)
async def test_sglang_a_request_for_an_adapter_not_loaded(
    emulated: EmulatedFactory, model: EngineModel, text: str
) -> None:
    async with emulated(1, **SGLANG, engine_model=model).http() as http:
        await _post(http, "/load_lora_adapter", {"lora_name": "a", "lora_path": "a"})
        body = {"model": "base-model:zz", **COMPLETION}
        whole = await _post(http, "/v1/completions", body)
        streamed = await _post(http, "/v1/completions", {**body, "stream": True})
    error = {"object": "error", "message": text, "type": "BadRequestError", "param": None}
    assert (whole.status_code, whole.json()) == (400, {**error, "code": 400})
    if model is EngineModel.SGLANG:  # since sgl-project/sglang#21900: refused before its 200
        assert (streamed.status_code, streamed.json()) == (400, {**error, "code": 400})
        return
    assert streamed.status_code == 200
    assert streamed.text == f"data: {json.dumps({**error, 'code': 400})}\n\ndata: [DONE]\n\n"


async def test_sglang_without_enable_metrics_has_no_metrics_route(
    emulated: EmulatedFactory,
) -> None:
    async with emulated(1, **SGLANG, sglang_metrics=False).http() as http:
        metrics, health = await http.get(URL + "/metrics"), await http.get(URL + "/health")
    assert (metrics.status_code, metrics.json(), health.status_code) == (
        404,
        {"detail": "Not Found"},
        200,
    )


async def test_sglang_dp_size_above_one_fails_loads_and_unloads_with_a_500(
    emulated: EmulatedFactory,
) -> None:
    async with emulated(1, **SGLANG, sglang_dp_size=2).http() as http:
        load = await _post(http, "/load_lora_adapter", {"lora_name": "a", "lora_path": "a"})
        unload = await _post(http, "/unload_lora_adapter", {"lora_name": "a"})
    assert [(r.status_code, r.text) for r in (load, unload)] == [(500, "Internal Server Error")] * 2


async def test_vllm_older_versions_answer_flat_errors_and_the_old_kv_gauge(
    emulated: EmulatedFactory,
) -> None:
    fleet = emulated(1, vllm_flat_errors=True, vllm_old_kv_metric=True)
    async with fleet.http() as http:
        absent = await _post(http, "/v1/unload_lora_adapter", {"lora_name": "zz"})
        metrics = (await http.get(URL + "/metrics")).text
    assert absent.json() == {
        "message": "The lora adapter 'zz' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    assert "vllm:gpu_cache_usage_perc{" in metrics and "kv_cache_usage_perc" not in metrics


async def test_vllm_a_rank_above_the_cap_is_a_400(
    emulated: EmulatedFactory, tmp_path: Path
) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 64}))
    async with emulated(1).http() as http:
        answer = await _post(
            http, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path)}
        )
    assert (answer.status_code, answer.json()) == (
        400,
        _vllm_error(
            400,
            "Call to add_lora method failed: LoRA rank 64 is greater than max_lora_rank 16.",
            "BadRequestError",
        ),
    )


async def test_vllm_stats_show_ghosts_and_a_reload_takes_a_new_entry(
    emulated: EmulatedFactory,
) -> None:
    fleet = emulated(1, max_loras=2, max_cpu_loras=4)
    async with fleet.http() as http:
        for name in ("a", "b"):
            await _post(http, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": name})
        await _post(http, "/v1/unload_lora_adapter", {"lora_name": "b"})
        ghosted = (await http.get(URL + "/admin/stats")).json()
        await _post(http, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "b"})
        reloaded = (await http.get(URL + "/admin/stats")).json()
    assert (ghosted["gpu"], ghosted["ghosts"], ghosted["listed"]) == (["a"], 1, ["a"])
    # the new b took a slot: the least recently used active entry (a) went, b's ghost stayed
    assert (reloaded["gpu"], reloaded["ghosts"]) == (["b"], 1)


async def test_sglang_pins_at_most_one_less_than_the_batch(emulated: EmulatedFactory) -> None:
    fleet = emulated(1, engine=Engine.SGLANG, max_loras=2, max_cpu_loras=4)
    async with fleet.http() as http:
        first = await _post(
            http, "/load_lora_adapter", {"lora_name": "a", "lora_path": "a", "pinned": True}
        )
        second = await _post(
            http, "/load_lora_adapter", {"lora_name": "b", "lora_path": "b", "pinned": True}
        )
        await _post(http, "/v1/chat/completions", {"model": "base-model:a", "messages": []})
        for model in ("base-model:c", "base-model:d"):
            await _post(http, "/load_lora_adapter", {"lora_name": model[-1], "lora_path": "x"})
            await _post(http, "/v1/chat/completions", {"model": model, "messages": []})
    assert first.status_code == 200 and second.status_code == 400
    assert "It is not allowed to pin all slots" in second.json()["error_message"]
    assert "a" in pod_stats(fleet.handles[0].pod)["gpu"]  # pinned, once used: never evicted


async def test_injected_errors_and_a_pod_that_dies_and_comes_back_empty(
    emulated: EmulatedFactory,
) -> None:
    clock = ManualClock()
    fleet = emulated(1, clock=clock)
    async with fleet.http() as http:
        await _post(http, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "p"})
        await _post(http, "/admin/fault", {"error_rate": 1.0})
        failing = await http.get(URL + "/v1/models")
        await _post(http, "/admin/fault", {"error_rate": 0.0, "down_s": 0.3})
        with pytest.raises(httpx.ConnectError):
            await http.get(URL + "/health")
        clock.advance(0.35)
        listed = (await http.get(URL + "/v1/models")).json()["data"]
        stats = (await http.get(URL + "/admin/stats")).json()
    assert failing.status_code == 500
    assert [card["id"] for card in listed] == ["base-model"]
    assert stats["counters"]["restarts"] == 1


def test_an_invalid_pod_config_is_refused() -> None:
    with pytest.raises(ValueError, match="max_lora_rank"):
        build_pod(PodConfig(max_lora_rank=12, latency=ZERO_LATENCY))


def test_fleet_domain_matches_the_pods() -> None:
    fleet = EmulatedFleet.start(3, config=PodConfig(max_loras=2, max_cpu_loras=5))
    pods = fleet.domain().pods
    assert [(p.name, p.url, p.max_cpu_loras) for p in pods] == [
        (f"pod-{i}", f"http://127.0.0.1:{18000 + i}", 5) for i in range(3)
    ]


def test_emulate_refuses_an_engine_model_its_dialect_cannot_speak() -> None:
    result = CliRunner().invoke(app, ["emulate", "--engine", "vllm", "--engine-model", "sglang"])
    assert result.exit_code != 0
    assert "engine model sglang does not speak vllm" in result.output


async def _answers(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(f"{url}/health")).status_code == 200
    except httpx.ConnectError:
        return False


async def _until_answers(http: httpx.AsyncClient, url: str, *, expected: bool) -> None:
    async with asyncio.timeout(10):
        while await _answers(http, url) != expected:
            await asyncio.sleep(0.02)


async def test_pods_serve_sockets_bound_on_port_0_and_come_back_on_their_port() -> None:
    clock = ManualClock()
    sockets = listening_sockets(2)
    ports = ports_of(sockets)
    assert len(set(ports)) == 2
    assert 0 not in ports
    config = PodConfig(latency=ZERO_LATENCY)
    fleet = EmulatedFleet.start(2, ports=ports, config=config, clock=clock)
    stop, listening = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(
        serve_fleet(fleet.handles, stop=stop, sockets=sockets, on_listening=listening.set)
    )
    try:
        await asyncio.wait_for(listening.wait(), timeout=10)
        first = fleet.handles[0]
        async with httpx.AsyncClient(timeout=5) as http:
            assert [await _answers(http, h.url) for h in fleet.handles] == [True, True]
            first.pod.kill(5.0)  # its port closes: connections are refused
            await _until_answers(http, first.url, expected=False)
            clock.advance(5.0)
            await _until_answers(http, first.url, expected=True)
    finally:
        stop.set()
        await asyncio.wait_for(serving, timeout=10)


async def test_a_stream_whose_client_left_before_its_first_byte_still_ends_its_request() -> None:
    """Starlette never iterates a stream whose start it could not send (the client left:
    ``StreamingResponse.stream_response`` raises at ``http.response.start``), so nothing
    in the body runs, its ``finally`` neither. The request must end all the same, or it
    stays running on its entry for good and no load ever takes that slot."""
    config = PodConfig(engine=Engine.VLLM, latency=ZERO_LATENCY, max_loras=1, max_cpu_loras=2)
    pod = EmulatedPod(config)
    await pod.load("a", "s3://adapters/a")
    body = json.dumps({"model": "a", "prompt": "hi", "max_tokens": 2, "stream": True}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Mapping[str, object]) -> None:
        if message["type"] == "http.response.start":
            raise OSError("the client left")

    with pytest.raises(ClientDisconnect):  # the server sees the client gone
        await create_vllm_app(pod)(scope, receive, send)
    ran = pod_stats(pod)["running"]
    await pod.load("b", "s3://adapters/b")
    assert (ran, pod.running_entries.busy(), pod.gpu) == (0, set(), ("b",))
