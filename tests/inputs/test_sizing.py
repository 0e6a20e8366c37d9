"""Adapter sizes are exact (docs/background.md), from dimensions, config.json or PEFT files."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placement import sizing
from placement.cli.app import app

runner = CliRunner()
LLAMA_70B = sizing.BUILTIN_MODELS["llama-3.1-70b"]


@pytest.mark.parametrize(
    ("rank", "targets", "params"),
    [
        pytest.param(16, ["q_proj", "v_proj"], 32_768_000, id="llama70b-rank16-qv"),
        pytest.param(64, ["q_proj", "k_proj", "v_proj"], 178_257_920, id="llama70b-rank64-qkv"),
        pytest.param(16, ["q", "v"], 32_768_000, id="short-module-names"),
        pytest.param(
            16, ["model.layers.0.self_attn.q_proj", "v_proj"], 32_768_000, id="dotted-names"
        ),
    ],
)
def test_llama_70b_parameter_counts(rank: int, targets: list[str], params: int) -> None:
    assert sizing.adapter_params(LLAMA_70B, rank, targets) == params


def test_bytes_follow_dtype() -> None:
    assert sizing.adapter_bytes(LLAMA_70B, 16, ["q_proj", "v_proj"], "float16") == 65_536_000
    assert sizing.adapter_bytes(LLAMA_70B, 16, ["q_proj", "v_proj"], "float32") == 131_072_000


def test_residency_budget_8_gib_of_240_mib_adapters_is_34() -> None:
    assert sizing.residency_budget(8 * 2**30, [240 * 2**20] * 3) == 34


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(
            lambda: sizing.adapter_params(LLAMA_70B, 16, ["qq_proj"]),
            "unknown target module",
            id="module",
        ),
        pytest.param(
            lambda: sizing.adapter_params(LLAMA_70B, 0, ["q_proj"]),
            "rank must be at least 1",
            id="rank",
        ),
        pytest.param(lambda: sizing.dtype_bytes("float13"), "unknown dtype", id="dtype"),
    ],
)
def test_bad_sizing_input(call: Callable[[], object], message: str) -> None:
    with pytest.raises(sizing.SizingError, match=message):
        call()


def write_peft(directory: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(
        json.dumps({"r": 8, "target_modules": ["q_proj"]})
    )
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = sizing.SAFETENSORS_DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    (directory / "adapter_model.safetensors").write_bytes(
        struct.pack("<Q", len(encoded)) + encoded + bytes(offset)
    )


def test_peft_directory_is_sized_from_its_header(tmp_path: Path) -> None:
    write_peft(tmp_path / "a", {"lora_A": ("F16", [8, 2048]), "lora_B": ("F16", [2048, 8])})
    found = sizing.peft_adapter_size(tmp_path / "a")
    assert (found.params, found.bytes) == (32768, 65536)


def test_cli_size_json_gives_the_exact_figures() -> None:
    result = runner.invoke(
        app,
        [
            "size",
            "--base",
            "llama-3.1-70b",
            "--rank",
            "16",
            "--targets",
            "q_proj,v_proj",
            "--dtype",
            "float16",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"params": 32_768_000, "bytes": 65_536_000}


def test_cli_size_of_peft_dir(tmp_path: Path) -> None:
    write_peft(tmp_path / "p", {"w": ("BF16", [4, 4])})
    result = runner.invoke(app, ["size", str(tmp_path / "p"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"params": 16, "bytes": 32}


def test_cli_size_from_config_json(tmp_path: Path) -> None:
    config = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "intermediate_size": 28672}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = runner.invoke(
        app, ["size", "--config", str(tmp_path / "config.json"), "--rank", "16", "--json"]
    )
    assert json.loads(result.output)["params"] == 32_768_000


def test_cli_catalog_budget(repo_root: Path) -> None:
    result = runner.invoke(
        app,
        [
            "size",
            "--catalog",
            str(repo_root / "data/legal-research/catalog.yaml"),
            "--budget",
            "8GiB",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # Every legal-research adapter is rank 16 on q, k, v and o of Llama-3.1-70B: 131 MB.
    assert report["fit_mean"] == (8 * 2**30) // 131_072_000


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["size", "--base", "gpt-5", "--rank", "8"], id="unknown-base"),
        pytest.param(["size", "--rank", "8"], id="nothing-to-size"),
        pytest.param(["size", "/nonexistent/dir"], id="not-a-peft-dir"),
    ],
)
def test_cli_size_bad_input_exits_2_without_traceback(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.output.startswith("error: ")
