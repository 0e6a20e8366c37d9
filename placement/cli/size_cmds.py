"""``lorafleet size``: an adapter's size, a catalog against a budget, a replica's three ledgers.

Four questions, one command:

- ``lorafleet size ADAPTER_DIR`` or ``--base B --rank R``: an adapter's parameters and bytes;
- ``--catalog C --budget 8GiB``: how many of a catalog's adapters fit a budget;
- ``--gpu G --base B --quant Q --max-loras N --max-lora-rank R``: the replica's three
  ledgers as vLLM lays them out (base weights, adapter slots, activations, and the KV
  cache left, in bytes and tokens); ``--fleet F --gpu G --quant Q`` does it per pool;
- ``--gpu G --base-bytes ... --kv-bytes ... --adapter-bytes ...``: a budget worked by
  hand, the KV cache chosen first and the adapters getting the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from placement import ledgers as ledger
from placement import sizing
from placement.cli.app import app, out, report_errors
from placement.domain import TARGET_MODULES
from placement.errors import InputError, Problem
from placement.inputs import load_catalog, load_fleet, parse_bytes


def _bytes(option: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise InputError([Problem(source=option, message=str(exc))]) from None


def _size_of_catalog(catalog: Path, fleet: Path | None, budget: str) -> dict[str, object]:
    parsed_fleet = load_fleet(fleet) if fleet else None
    adapters = load_catalog(catalog, fleet=parsed_fleet).adapters
    budget_bytes = _bytes("--budget", budget) or 0
    sizes = [adapter.size_bytes for adapter in adapters]
    return {
        "adapters": len(sizes),
        "budget_bytes": budget_bytes,
        "mean_bytes": round(sum(sizes) / len(sizes)) if sizes else 0,
        "max_bytes": max(sizes, default=0),
        "fit_mean": sizing.residency_budget(budget_bytes, sizes) if sizes else 0,
        "fit_largest": budget_bytes // max(sizes) if sizes else 0,
    }


def base_model(base: str | None, config: Path | None) -> ledger.BaseModel:
    """A built-in base model by name, or one read from a model's ``config.json``."""
    if config is not None:
        try:
            parsed = json.loads(config.read_text())
        except OSError as exc:
            raise sizing.SizingError(f"cannot read {config}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise sizing.SizingError(f"{config} is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise sizing.SizingError(f"{config}: expected a JSON object")
        return ledger.base_from_config(parsed, source=str(config))
    if base is None:
        raise sizing.SizingError("give --base (a built-in model) or --config (a config.json)")
    return ledger.builtin_base(base)


def _targets(targets: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if targets is None:
        return default
    if targets.strip().lower() == "all":
        return TARGET_MODULES
    return tuple(sorted({sizing.normalise_module(name) for name in targets.split(",")}))


def _size_of(
    peft_dir: Path | None,
    base: str | None,
    config: Path | None,
    rank: int | None,
    targets: str | None,
    dtype: str,
) -> sizing.AdapterSize:
    if peft_dir is not None:
        return sizing.peft_adapter_size(peft_dir)
    if rank is None or (base is None and config is None):
        raise sizing.SizingError("give a PEFT directory, or --rank with --base or --config")
    dims = sizing.model_dims_from_config(config) if config else ledger.builtin_base(base or "").dims
    return sizing.adapter_size(dims, rank, list(_targets(targets, ("q_proj", "v_proj"))), dtype)


@app.command()
@report_errors
def size(
    peft_dir: Annotated[Path | None, typer.Argument(help="a PEFT adapter directory")] = None,
    base: Annotated[
        str | None, typer.Option(help="built-in base model, e.g. llama-3.1-70b")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="a Hugging Face config.json instead of --base")
    ] = None,
    rank: Annotated[int | None, typer.Option(help="LoRA rank")] = None,
    targets: Annotated[
        str | None,
        typer.Option(
            help="target modules, comma-separated, or 'all' (adapters: q_proj,v_proj; "
            "ledgers: all, as vLLM wraps every projection)"
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="adapter dtype: float16, bfloat16, float32")] = (
        "float16"
    ),
    catalog: Annotated[Path | None, typer.Option(help="size a catalog against --budget")] = None,
    fleet: Annotated[
        Path | None, typer.Option(help="fleet.yaml: base-model dimensions, or ledgers per pool")
    ] = None,
    budget: Annotated[str, typer.Option(help="a pod's adapter budget, e.g. 8GiB")] = "8GiB",
    gpu: Annotated[
        str | None, typer.Option(help=f"GPU for the three ledgers: {', '.join(ledger.GPUS)}")
    ] = None,
    gpu_bytes: Annotated[str | None, typer.Option(help="device memory instead of --gpu")] = None,
    quant: Annotated[str, typer.Option(help="base weights: int4, int8, fp8, fp16, bf16")] = "fp16",
    max_loras: Annotated[int, typer.Option(help="adapter slots (vLLM --max-loras)")] = 8,
    max_lora_rank: Annotated[int, typer.Option(help="vLLM --max-lora-rank")] = 16,
    max_model_len: Annotated[int, typer.Option(help="vLLM --max-model-len")] = 8192,
    gpu_memory_utilization: Annotated[
        float, typer.Option(help="vLLM --gpu-memory-utilization")
    ] = 0.9,
    activation_bytes: Annotated[
        str | None, typer.Option(help="activations and CUDA workspace (default about 5 GB)")
    ] = None,
    base_bytes: Annotated[
        str | None, typer.Option(help="base weights and runtime, instead of computing them")
    ] = None,
    kv_bytes: Annotated[
        str | None, typer.Option(help="KV cache chosen first: the adapters get the rest")
    ] = None,
    headroom_bytes: Annotated[
        str | None, typer.Option(help="safety headroom kept free (with --kv-bytes)")
    ] = None,
    adapter_bytes: Annotated[
        str | None, typer.Option(help="one adapter's size (with --kv-bytes)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """An adapter's size, a catalog against a budget, or a replica's three ledgers."""
    report: dict[str, object]
    try:
        if gpu is not None or gpu_bytes is not None:
            device = _bytes("--gpu-bytes", gpu_bytes) or ledger.gpu_bytes(gpu or "")
            activations = _bytes("--activation-bytes", activation_bytes)
            if kv_bytes is not None:
                report = _hand_budget(
                    device=device,
                    base=_bytes("--base-bytes", base_bytes),
                    kv=_bytes("--kv-bytes", kv_bytes) or 0,
                    adapter=_bytes("--adapter-bytes", adapter_bytes),
                    activations=activations,
                    headroom=_bytes("--headroom-bytes", headroom_bytes) or 0,
                )
            elif fleet is not None:
                report = {
                    "pools": [
                        {"pool": str(pool.name)}
                        | ledger.ledgers(
                            ledger.builtin_base(pool.base_model)
                            if config is None
                            else base_model(None, config),
                            device_bytes=device,
                            quant=quant,
                            max_loras=max(pod.max_loras for pod in pool.pods),
                            max_lora_rank=pool.max_lora_rank,
                            targets=_targets(targets, TARGET_MODULES),
                            max_model_len=max_model_len,
                            gpu_memory_utilization=gpu_memory_utilization,
                            activation_bytes=_activations(activations),
                            base_bytes=_bytes("--base-bytes", base_bytes),
                        ).as_dict()
                        for pool in load_fleet(fleet).pools
                    ]
                }
            else:
                report = dict(
                    ledger.ledgers(
                        base_model(base, config),
                        device_bytes=device,
                        quant=quant,
                        max_loras=max_loras,
                        max_lora_rank=max_lora_rank,
                        targets=_targets(targets, TARGET_MODULES),
                        max_model_len=max_model_len,
                        gpu_memory_utilization=gpu_memory_utilization,
                        activation_bytes=_activations(activations),
                        base_bytes=_bytes("--base-bytes", base_bytes),
                    ).as_dict()
                )
        elif catalog is not None:
            report = _size_of_catalog(catalog, fleet, budget)
        else:
            found = _size_of(peft_dir, base, config, rank, targets, dtype)
            report = {"params": found.params, "bytes": found.bytes}
    except sizing.SizingError as exc:
        raise InputError([Problem(source="lorafleet size", message=str(exc))]) from None
    if as_json:
        out().print_json(json.dumps(report))
        return
    _print(report)


def _activations(value: int | None) -> int:
    return ledger.DEFAULT_ACTIVATION_BYTES if value is None else value


def _hand_budget(
    *,
    device: int,
    base: int | None,
    kv: int,
    adapter: int | None,
    activations: int | None,
    headroom: int,
) -> dict[str, object]:
    if base is None or adapter is None:
        raise sizing.SizingError("with --kv-bytes give --base-bytes and --adapter-bytes too")
    return dict(
        ledger.adapter_budget(
            device_bytes=device,
            base_bytes=base,
            kv_bytes=kv,
            adapter_bytes=adapter,
            activation_bytes=activations or 0,
            headroom_bytes=headroom,
        ).as_dict()
    )


def _print(report: dict[str, object], indent: str = "") -> None:
    for key, value in report.items():
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    _print(item, indent + "  ")
                    out().print()
        elif isinstance(value, int) and key.endswith("_bytes"):
            out().print(f"{indent}{key:>24}: {value:>16,}  ({value / ledger.GIB:,.2f} GiB)")
        elif isinstance(value, int):
            out().print(f"{indent}{key:>24}: {value:>16,}")
        else:
            out().print(f"{indent}{key:>24}: {value}")
