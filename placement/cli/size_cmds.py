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
from dataclasses import dataclass
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
        # as sizing reads it: not UTF-8 or nested too deep is one line, not a traceback
        return ledger.base_from_config(sizing.read_json_object(config), source=str(config))
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


# Past 80 lines for its option declarations alone (each flag's name, default and help
# in one place, as ``--help`` shows them); the body is a few named calls.
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
            replica = _Replica(
                device_bytes=_bytes("--gpu-bytes", gpu_bytes) or ledger.gpu_bytes(gpu or ""),
                activation_bytes=_bytes("--activation-bytes", activation_bytes),
                quant=quant,
                targets=targets,
                max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                base_bytes=base_bytes,
            )
            if kv_bytes is not None:
                report = _hand_budget(
                    replica,
                    base=base_bytes,
                    kv=kv_bytes,
                    adapter=adapter_bytes,
                    headroom=headroom_bytes,
                )
            elif fleet is not None:
                report = _pools_report(replica, fleet, config=config)
            else:
                model = base_model(base, config)
                report = replica.ledgers(model, max_loras=max_loras, max_lora_rank=max_lora_rank)
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


@dataclass(frozen=True, kw_only=True)
class _Replica:
    """The flags every ledger reads; ``--base-bytes`` parsed at each use, as before."""

    device_bytes: int
    activation_bytes: int | None
    quant: str
    targets: str | None
    max_model_len: int
    gpu_memory_utilization: float
    base_bytes: str | None

    def ledgers(
        self, model: ledger.BaseModel, *, max_loras: int, max_lora_rank: int
    ) -> dict[str, object]:
        """The three ledgers of one replica of ``model`` (``placement.ledgers``)."""
        return dict(
            ledger.ledgers(
                model,
                device_bytes=self.device_bytes,
                quant=self.quant,
                max_loras=max_loras,
                max_lora_rank=max_lora_rank,
                targets=_targets(self.targets, TARGET_MODULES),
                max_model_len=self.max_model_len,
                gpu_memory_utilization=self.gpu_memory_utilization,
                activation_bytes=_activations(self.activation_bytes),
                base_bytes=_bytes("--base-bytes", self.base_bytes),
            ).as_dict()
        )


def _pools_report(replica: _Replica, fleet: Path, *, config: Path | None) -> dict[str, object]:
    """``--fleet`` with ``--gpu``: the ledgers of each pool's replica (its own base model,
    unless ``--config``, its largest ``max_loras`` and its rank cap)."""
    return {
        "pools": [
            {"pool": str(pool.name)}
            | replica.ledgers(
                ledger.builtin_base(pool.base_model)
                if config is None
                else base_model(None, config),
                max_loras=max(pod.max_loras for pod in pool.pods),
                max_lora_rank=pool.max_lora_rank,
            )
            for pool in load_fleet(fleet).pools
        ]
    }


def _activations(value: int | None) -> int:
    return ledger.DEFAULT_ACTIVATION_BYTES if value is None else value


def _hand_budget(
    replica: _Replica, *, base: str | None, kv: str, adapter: str | None, headroom: str | None
) -> dict[str, object]:
    """``--kv-bytes``: the KV cache chosen first, the adapters getting the rest."""
    base_bytes = _bytes("--base-bytes", base)
    kv_bytes = _bytes("--kv-bytes", kv) or 0
    adapter_bytes = _bytes("--adapter-bytes", adapter)
    headroom_bytes = _bytes("--headroom-bytes", headroom) or 0
    if base_bytes is None or adapter_bytes is None:
        raise sizing.SizingError("with --kv-bytes give --base-bytes and --adapter-bytes too")
    return dict(
        ledger.adapter_budget(
            device_bytes=replica.device_bytes,
            base_bytes=base_bytes,
            kv_bytes=kv_bytes,
            adapter_bytes=adapter_bytes,
            activation_bytes=replica.activation_bytes or 0,
            headroom_bytes=headroom_bytes,
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
