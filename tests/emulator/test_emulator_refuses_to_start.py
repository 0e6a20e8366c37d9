"""The contract for a configuration the engines refuse to start with: fewer host slots
than GPU slots. vLLM refuses ``--max-cpu-loras`` below ``--max-loras``
(vllm-project/vllm vllm/config/lora.py ``LoRAConfig._validate_lora_config``), SGLang
``--max-loaded-loras`` below ``--max-loras-per-batch``
(sgl-project/sglang python/sglang/srt/server_args.py ``ServerArgs.check_lora_server_args``);
``PodConfig._host_below_gpu`` gives each engine's reason. The emulated pods refuse the
same, in the engine's words: ``lorafleet emulate`` exits before it listens, and
``build_pod`` raises. vLLM takes an unset ``--max-cpu-loras`` as ``max_loras``.
"""

from __future__ import annotations

import re

import httpx
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import Engine
from placement.emulator import ZERO_LATENCY, PodConfig, build_pod

runner = CliRunner()

REFUSALS = [
    pytest.param(
        Engine.VLLM, "max_cpu_loras (2) must be >= max_loras (4)", id="vllm-max-cpu-loras"
    ),
    pytest.param(
        Engine.SGLANG,
        "max_loaded_loras should be greater than or equal to max_loras_per_batch. "
        "max_loaded_loras=2, max_loras_per_batch=4",
        id="sglang-max-loaded-loras",
    ),
]


@pytest.mark.parametrize(("engine", "refusal"), REFUSALS)
def test_emulate_will_not_start_with_fewer_host_than_gpu_slots(
    engine: Engine, refusal: str
) -> None:
    flags = ["--engine", engine.value, "--max-loras", "4", "--max-cpu-loras", "2"]
    result = runner.invoke(app, ["emulate", "--pods", "1", *flags], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert refusal in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("engine", "refusal"), REFUSALS)
def test_no_pod_is_built_with_fewer_host_than_gpu_slots(engine: Engine, refusal: str) -> None:
    config = PodConfig(engine=engine, max_loras=4, max_cpu_loras=2, latency=ZERO_LATENCY)
    with pytest.raises(ValueError, match=re.escape(refusal)):
        build_pod(config)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("engine", "max_cpu_loras", "host_slots"),
    [
        pytest.param(Engine.VLLM, 4, 4, id="vllm-as-many"),
        pytest.param(Engine.VLLM, None, 4, id="vllm-unset-is-max-loras"),
        pytest.param(Engine.SGLANG, 4, 4, id="sglang-as-many"),
    ],
)
async def test_as_many_host_as_gpu_slots_starts(
    engine: Engine, max_cpu_loras: int | None, host_slots: int
) -> None:
    config = PodConfig(engine=engine, max_loras=4, max_cpu_loras=max_cpu_loras)
    handle = build_pod(config)
    transport = httpx.ASGITransport(app=handle.app)
    async with httpx.AsyncClient(transport=transport, base_url=handle.url) as http:
        stats = (await http.get("/admin/stats")).json()
    assert stats["limits"] == {"max_loras": 4, "max_cpu_loras": host_slots}
