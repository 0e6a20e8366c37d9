"""The contract for names at the wire, for every pod (``target``): a request for a model
the pod does not serve, two unloads of one name at once, and the adapter cards of
``/v1/models``. Each test's docstring names the engine source it encodes
(``contract_target``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from placement.domain import Engine
from tests.pods.contract_target import HARD, Target, message, only

pytestmark = pytest.mark.anyio


async def _spin() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _by_status(answers: list[httpx.Response]) -> list[httpx.Response]:
    return sorted(answers, key=lambda answer: answer.status_code)


# -- a model the pod does not serve ------------------------------------------------------


def _request(route: str, model: str, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": 2, "stream": stream}
    if route == "/v1/chat/completions":
        return body | {"messages": [{"role": "user", "content": "hello"}]}
    return body | {"prompt": "hello"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_vllm_a_request_for_a_model_it_does_not_serve_is_404_naming_param_model(
    target: Target, route: str, stream: bool
) -> None:
    """vllm-project/vllm vllm/entrypoints/openai/engine/serving.py
    ``OpenAIServing._check_model``: a name neither served nor in ``lora_requests`` (and
    that no LoRA resolver loads) is ``create_error_response(message="The model `<m>`
    does not exist.", err_type="NotFoundError", status_code=404, param="model")``,
    checked before any stream starts; the body is ``ErrorResponse(error=ErrorInfo(...))``
    (vllm/entrypoints/openai/engine/protocol.py). A name unloaded is forgotten
    (vllm/entrypoints/openai/models/serving.py ``unload_lora_adapter``), so it is
    refused the same way."""
    only(target, Engine.VLLM)
    await target.load("c-a")
    await target.unload("c-a")
    for model in ("c-zz", "c-a"):
        answer = await target.http.post(
            target.url + route, json=_request(route, model, stream=stream)
        )
        error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError"}
        assert (answer.status_code, answer.json()) == (
            404,
            {"error": error | {"param": "model", "code": 404}},
        )


# -- two unloads of one name at once -----------------------------------------------------


async def test_vllm_of_two_unloads_of_one_name_the_second_finds_it_gone(
    target: Target,
) -> None:
    """Both take the name's lock (vllm-project/vllm
    vllm/entrypoints/openai/models/serving.py ``OpenAIServingModels.unload_lora_adapter``:
    ``async with self.lora_resolver_lock[lora_name]``); the one that comes second finds
    the name gone (``_check_unload_lora_adapter_request``): 404 ``NotFoundError``."""
    only(target, Engine.VLLM)
    await target.load("c-a")
    first, second = _by_status(
        list(await asyncio.gather(target.unload("c-a"), target.unload("c-a")))
    )
    assert (first.status_code, first.text) == (
        200,
        "Success: LoRA adapter 'c-a' removed successfully.",
    )
    assert (second.status_code, second.json()) == (
        404,
        {
            "error": {
                "message": "The lora adapter 'c-a' cannot be found.",
                "type": "NotFoundError",
                "param": None,
                "code": 404,
            }
        },
    )
    assert await target.listed() == []


async def test_sglang_of_two_unloads_of_one_name_the_second_waits_then_finds_it_gone(
    target: Target,
) -> None:
    """Every unload runs under the tokenizer manager's one ``lora_update_lock``
    (sgl-project/sglang python/sglang/srt/managers/tokenizer_control_mixin.py
    ``unload_lora_adapter``), held while ``_unload_lora_adapter_locked`` waits for the
    adapter's requests in flight; the second then meets
    python/sglang/srt/lora/lora_registry.py ``LoRARegistry.unregister``: ``ValueError``
    "LoRA with name <n> does not exist. Loaded LoRAs: <registry keys>", answered 400
    ``{"success": false, ...}`` (python/sglang/srt/entrypoints/http_server.py
    ``unload_lora_adapter``). The keys print as an ``OrderedDict``'s since the soft cap,
    a dict's before. On an emulated pod a request in flight holds the first unload, so
    the second is seen waiting for the lock."""
    only(target, Engine.SGLANG)
    await target.load("c-a")
    if target.emulated is None:
        answers = list(await asyncio.gather(target.unload("c-a"), target.unload("c-a")))
        waited = (False, False)
    else:
        await target.emulated.admit("c-a")
        unloading = [asyncio.create_task(target.unload("c-a"))]
        await _spin()
        unloading.append(asyncio.create_task(target.unload("c-a")))
        await _spin()
        waited = (unloading[0].done(), unloading[1].done())
        await target.emulated.release("c-a")  # before any assert: a failure must not hang
        answers = list(await asyncio.gather(*unloading))
    first, second = _by_status(answers)
    assert waited == (False, False)
    assert (first.status_code, first.json()["success"]) == (200, True)
    keys = {None: "", HARD: "dict_keys"}.get(target.model, "odict_keys")
    assert (second.status_code, second.json()["success"]) == (400, False)
    assert second.json()["error_message"].startswith(
        "LoRA with name c-a does not exist. Loaded LoRAs: "
    )
    assert message(second).endswith(f"{keys}([])")
    assert await target.listed() == []


# -- adapter cards -------------------------------------------------------------------------


async def test_vllm_an_adapter_card_names_the_served_base_as_its_parent(target: Target) -> None:
    """vllm-project/vllm vllm/entrypoints/openai/models/serving.py
    ``OpenAIServingModels.show_available_models``: the base cards first (``root`` the
    model path, no ``parent``), then one card per loaded adapter, in load order, with
    ``root=lora.path`` and ``parent`` the adapter's ``base_model_name`` or, as for every
    adapter loaded over HTTP, the first served name (``base_model_paths[0].name``)."""
    only(target, Engine.VLLM)
    for name in ("c-a", "c-b"):
        await target.load(name)
    cards = (await target.http.get(target.url + "/v1/models")).json()["data"]
    base, *adapters = cards
    assert base["parent"] is None
    if target.emulated is not None:
        assert base["id"] == target.base
    assert [(card["id"], card["root"], card["parent"]) for card in adapters] == [
        ("c-a", target.lora_path, base["id"]),
        ("c-b", target.lora_path, base["id"]),
    ]
    assert all((card["object"], card["owned_by"]) == ("model", "vllm") for card in cards)
