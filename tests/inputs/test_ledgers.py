"""The three ledgers of a replica, and the two budgets the seeds work by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import TARGET_MODULES
from placement.ledgers import (
    GIB,
    adapter_budget,
    adapter_slots_bytes,
    base_from_config,
    base_weight_bytes,
    builtin_base,
    gpu_bytes,
    kv_bytes_per_token,
    ledgers,
)
from placement.sizing import BUILTIN_MODELS, SizingError

GB = 10**9
MB = 10**6
MIB = 2**20


def test_seed_000_budget_80_minus_35_30_5_is_10_gb_or_200_adapters_of_50_mb() -> None:
    budget = adapter_budget(
        device_bytes=80 * GB,
        base_bytes=35 * GB,
        kv_bytes=30 * GB,
        activation_bytes=5 * GB,
        adapter_bytes=50 * MB,
    )
    assert budget.adapter_budget_bytes == 10 * GB
    assert budget.adapters_fit == 200
    rank_64 = adapter_budget(
        device_bytes=80 * GB,
        base_bytes=35 * GB,
        kv_bytes=30 * GB,
        activation_bytes=5 * GB,
        adapter_bytes=200 * MB,
    )
    assert rank_64.adapters_fit == 50


def test_seed_003_budget_8_gib_holds_34_adapters_of_240_mib() -> None:
    budget = adapter_budget(
        device_bytes=80 * GIB,
        base_bytes=48 * GIB,
        headroom_bytes=4 * GIB,
        kv_bytes=20 * GIB,
        adapter_bytes=240 * MIB,
    )
    assert budget.adapter_budget_bytes == 8 * GIB
    assert budget.adapters_fit == 34


def test_a_negative_budget_says_which_ledgers_ate_it() -> None:
    with pytest.raises(SizingError, match=r"negative.*KV"):
        adapter_budget(
            device_bytes=40 * GIB, base_bytes=35 * GIB, kv_bytes=30 * GIB, adapter_bytes=1
        )


def test_base_weights_of_llama_70b_and_8b_match_their_published_sizes() -> None:
    seventy = builtin_base("llama-3.1-70b")
    # 70.6 B parameters: 141 GB in 16 bits; INT4 keeps embeddings and head at 16 bits.
    assert base_weight_bytes(seventy, "fp16") == pytest.approx(141.1 * GB, rel=0.005)
    assert base_weight_bytes(seventy, "int4") == pytest.approx(38.4 * GB, rel=0.005)
    assert base_weight_bytes(builtin_base("llama-3.1-8b"), "bf16") == pytest.approx(
        16.06 * GB, rel=0.005
    )


def test_vllm_slots_are_max_loras_times_the_rank_cap_on_every_projection() -> None:
    dims = BUILTIN_MODELS["llama-3.1-70b"]
    one = adapter_slots_bytes(
        dims, max_loras=1, max_lora_rank=16, targets=("q_proj", "v_proj"), dtype_bytes=2
    )
    assert one == 65_536_000  # a rank-16 q/v adapter on 70B: 65.5 MB (docs/background.md)
    eight = adapter_slots_bytes(
        dims, max_loras=8, max_lora_rank=64, targets=TARGET_MODULES, dtype_bytes=2
    )
    q, k, v, o = 8192 + 8192, 8192 + 1024, 8192 + 1024, 8192 + 8192
    gate, up, down = 8192 + 28672, 8192 + 28672, 28672 + 8192
    per_layer = q + k + v + o + gate + up + down
    assert eight == 8 * 64 * per_layer * 80 * 2


def test_the_kv_cache_gets_what_is_left_and_its_tokens() -> None:
    seventy = builtin_base("llama-3.1-70b")
    found = ledgers(
        seventy,
        device_bytes=gpu_bytes("h100-80gb"),
        quant="int4",
        max_loras=8,
        max_lora_rank=64,
        max_model_len=8192,
    )
    assert found.usable_bytes == int(80 * GIB * 0.9)
    assert found.kv_bytes == (
        found.usable_bytes - found.base_bytes - found.adapter_slots_bytes - found.activation_bytes
    )
    assert found.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == kv_bytes_per_token(seventy.dims)
    assert found.kv_tokens == found.kv_bytes // found.kv_bytes_per_token
    assert found.full_length_sequences == found.kv_tokens // 8192
    # Four more slots of the same rank cap cost KV tokens, never base weights.
    more = ledgers(
        seventy,
        device_bytes=gpu_bytes("h100-80gb"),
        quant="int4",
        max_loras=12,
        max_lora_rank=64,
    )
    assert more.base_bytes == found.base_bytes
    assert more.kv_tokens < found.kv_tokens


def test_a_kv_cache_too_small_for_one_sequence_is_refused_as_vllm_refuses() -> None:
    with pytest.raises(SizingError, match="less than one sequence"):
        ledgers(
            builtin_base("llama-3.1-70b"),
            device_bytes=gpu_bytes("h100-80gb"),
            quant="int4",
            max_loras=8,
            max_lora_rank=64,
            max_model_len=131_072,
        )
    with pytest.raises(SizingError, match="nothing left for the KV cache"):
        ledgers(
            builtin_base("llama-3.1-70b"),
            device_bytes=gpu_bytes("h100-80gb"),
            quant="fp16",
            max_loras=8,
            max_lora_rank=64,
        )


def test_a_config_json_gives_a_base_model() -> None:
    config: dict[str, object] = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    }
    model = base_from_config(config, source="config.json")
    assert base_weight_bytes(model, "bf16") == base_weight_bytes(
        builtin_base("llama-3.1-8b"), "bf16"
    )
    with pytest.raises(SizingError, match=r"config\.json: missing 'vocab_size'"):
        base_from_config(
            {k: v for k, v in config.items() if k != "vocab_size"}, source="config.json"
        )


runner = CliRunner()


def test_cli_prints_the_ledgers_interface_keys() -> None:
    result = runner.invoke(
        app,
        [
            "size", "--gpu", "h100-80gb", "--base", "llama-3.1-70b", "--quant", "int4",
            "--max-loras", "8", "--max-lora-rank", "64", "--targets", "all",
            "--max-model-len", "8192", "--gpu-memory-utilization", "0.9", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("base_bytes", "adapter_slots_bytes", "kv_bytes", "kv_tokens"):
        assert isinstance(report[key], int) and report[key] > 0


def test_cli_reproduces_seed_000_by_hand() -> None:
    result = runner.invoke(
        app,
        [
            "size", "--gpu-bytes", "80GB", "--base-bytes", "35GB", "--kv-bytes", "30GB",
            "--activation-bytes", "5GB", "--adapter-bytes", "50MB", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["adapter_budget_bytes"] == 10 * GB
    assert report["adapters_fit"] == 200


def test_cli_names_the_options_for_an_unknown_gpu_or_model(tmp_path: Path) -> None:
    result = runner.invoke(app, ["size", "--gpu", "a99", "--base", "llama-3.1-70b"])
    assert result.exit_code == 2
    assert "unknown GPU 'a99'" in result.stderr and "h100-80gb" in result.stderr
    result = runner.invoke(app, ["size", "--gpu", "h100-80gb", "--base", "gpt-x"])
    assert result.exit_code == 2
    assert "unknown base model 'gpt-x'" in result.stderr and "--config" in result.stderr
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    result = runner.invoke(app, ["size", "--gpu", "h100-80gb", "--config", str(broken)])
    assert result.exit_code == 2
    assert "config.json is not valid JSON" in result.stderr
    assert "Traceback" not in result.output


def test_cli_ledgers_per_pool_of_a_fleet() -> None:
    fleet = Path(__file__).resolve().parents[2] / "data" / "war-story" / "fleet.yaml"
    result = runner.invoke(
        app, ["size", "--fleet", str(fleet), "--gpu", "h100-80gb", "--quant", "int4", "--json"]
    )
    assert result.exit_code == 0, result.output
    (pool,) = json.loads(result.stdout)["pools"]
    assert pool["pool"] == "llama-70b" and pool["kv_tokens"] > 8192
