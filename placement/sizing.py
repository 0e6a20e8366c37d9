"""How big a LoRA adapter is: parameters and bytes, from base-model dimensions or a PEFT file.

A LoRA on one projection of shape (in, out) adds A (r x in) and B (out x r): r * (in + out)
parameters per layer. For Llama-3.1-70B, rank 16 on q_proj and v_proj is 32,768,000
parameters, 65,536,000 bytes in fp16 (docs/background.md has the table).

Pure except ``peft_adapter_size`` and ``model_dims_from_config``, which read only the
small JSON parts of files (the safetensors header, never the tensors).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement.domain import TARGET_MODULES, ModelDims

#: Bytes per element of the dtypes adapters are stored in.
DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "int8": 1,
}

#: safetensors dtype codes to bytes per element.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}

BUILTIN_MODELS: dict[str, ModelDims] = {
    dims.name: dims
    for dims in (
        ModelDims(
            name="llama-3.1-8b",
            hidden_size=4096,
            num_layers=32,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
        ),
        ModelDims(
            name="llama-3.1-70b",
            hidden_size=8192,
            num_layers=80,
            num_attention_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=28672,
        ),
        ModelDims(
            name="llama-3.2-1b",
            hidden_size=2048,
            num_layers=16,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=64,
            intermediate_size=8192,
        ),
        ModelDims(
            name="mistral-7b",
            hidden_size=4096,
            num_layers=32,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
        ),
        ModelDims(
            name="qwen2.5-7b",
            hidden_size=3584,
            num_layers=28,
            num_attention_heads=28,
            num_kv_heads=4,
            head_dim=128,
            intermediate_size=18944,
        ),
    )
}


class SizingError(ValueError):
    """A size cannot be computed; the message says what is missing."""


@dataclass(frozen=True, kw_only=True)
class AdapterSize:
    params: int
    bytes: int


def normalise_module(module: str) -> str:
    """Accept ``q``, ``q_proj`` or ``self_attn.q_proj`` for the same projection."""
    short = module.rsplit(".", 1)[-1]
    name = short if short.endswith("_proj") else f"{short}_proj"
    if name not in TARGET_MODULES:
        raise SizingError(
            f"unknown target module {module!r}; expected one of {', '.join(TARGET_MODULES)}"
        )
    return name


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise SizingError(
            f"unknown dtype {dtype!r}; expected one of {', '.join(sorted(DTYPE_BYTES))}"
        ) from None


def adapter_params(dims: ModelDims, rank: int, target_modules: tuple[str, ...] | list[str]) -> int:
    """Parameters of a LoRA of ``rank`` on ``target_modules`` of every layer of ``dims``."""
    if rank < 1:
        raise SizingError(f"rank must be at least 1, got {rank}")
    per_layer = 0
    for module in {normalise_module(m) for m in target_modules}:
        in_features, out_features = dims.projection_shape(module)
        per_layer += rank * (in_features + out_features)
    return per_layer * dims.num_layers


def adapter_size(
    dims: ModelDims, rank: int, target_modules: tuple[str, ...] | list[str], dtype: str
) -> AdapterSize:
    params = adapter_params(dims, rank, target_modules)
    return AdapterSize(params=params, bytes=params * dtype_bytes(dtype))


def adapter_bytes(
    dims: ModelDims, rank: int, target_modules: tuple[str, ...] | list[str], dtype: str
) -> int:
    return adapter_size(dims, rank, target_modules, dtype).bytes


def residency_budget(budget_bytes: int, adapter_sizes: list[int]) -> int:
    """How many adapters of the catalog's mean size fit a budget (8 GiB / 240 MiB = 34)."""
    if not adapter_sizes:
        raise SizingError("the catalog has no adapters to size the budget with")
    mean_bytes = sum(adapter_sizes) / len(adapter_sizes)
    return math.floor(budget_bytes / mean_bytes)


def model_dims_from_config(path: Path, *, name: str | None = None) -> ModelDims:
    """Read the dimensions from a Hugging Face ``config.json``."""
    config = read_json_object(path)
    return dims_from_config(
        config, source=str(path), name=name or str(config.get("_name_or_path") or path.parent.name)
    )


def dims_from_config(config: dict[str, Any], *, source: str, name: str) -> ModelDims:
    """The dimensions in a parsed ``config.json``; SizingError naming ``source`` and the
    key that is missing or not a whole number above 0 ("num_attention_heads": 0 divided
    by zero; a negative hidden_size gave an adapter of negative bytes)."""
    hidden = config_count(config, "hidden_size", source=source)
    heads = config_count(config, "num_attention_heads", source=source)
    return ModelDims(
        name=name,
        hidden_size=hidden,
        num_layers=config_count(config, "num_hidden_layers", source=source),
        num_attention_heads=heads,
        num_kv_heads=config_count(config, "num_key_value_heads", source=source, default=heads),
        head_dim=config_count(config, "head_dim", source=source, default=max(hidden // heads, 1)),
        intermediate_size=config_count(config, "intermediate_size", source=source),
    )


def config_count(
    config: dict[str, Any], key: str, *, source: str, default: int | None = None
) -> int:
    """``config[key]``, a whole number above 0 (``default`` when absent or null)."""
    if config.get(key) is None:
        if default is None:
            raise SizingError(f"{source}: missing {key!r}")
        return default
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SizingError(f"{source}: {key}: expected a whole number above 0, got {value!r}")
    return value


def read_safetensors_header(path: Path) -> dict[str, object]:
    """The JSON header of a safetensors file; the tensors are not read."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise SizingError(f"{path}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length > 100_000_000:
                raise SizingError(f"{path}: header length {length} is implausible")
            header = json.loads(handle.read(length))
    except OSError as exc:
        raise SizingError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SizingError(f"{path}: the safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise SizingError(f"{path}: the safetensors header is not a JSON object")
    return header


def peft_adapter_size(directory: Path) -> AdapterSize:
    """Size of a PEFT adapter directory from its safetensors header (no tensors loaded)."""
    weights = directory / "adapter_model.safetensors"
    if not (directory / "adapter_config.json").is_file():
        raise SizingError(f"{directory}: no adapter_config.json (not a PEFT adapter directory)")
    if not weights.is_file():
        raise SizingError(f"{directory}: no adapter_model.safetensors")
    params = 0
    total_bytes = 0
    for tensor_name, spec in read_safetensors_header(weights).items():
        if tensor_name == "__metadata__":
            continue
        if not isinstance(spec, dict) or "shape" not in spec or "dtype" not in spec:
            raise SizingError(f"{weights}: tensor {tensor_name!r} has no shape or dtype")
        shape = spec["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            # [-5, 3] gave negative bytes, ["x"] and 5 a traceback, [1.5e300] 1e300 bytes
            raise SizingError(
                f"{weights}: tensor {tensor_name!r}: shape is not a list of whole numbers >= 0"
            )
        numel = math.prod(shape)
        element = SAFETENSORS_DTYPE_BYTES.get(str(spec["dtype"]))
        if element is None:
            raise SizingError(
                f"{weights}: tensor {tensor_name!r} has unknown dtype {spec['dtype']}"
            )
        params += numel
        total_bytes += numel * element
    return AdapterSize(params=params, bytes=total_bytes)


def peft_adapter_config(directory: Path) -> dict[str, object]:
    """The parsed ``adapter_config.json`` of a PEFT directory."""
    return read_json_object(directory / "adapter_config.json")


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; SizingError naming the file if it cannot be read, is
    not JSON or holds something else. Its values are the file's, unchecked: each caller
    converts the fields it reads."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SizingError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SizingError(f"{path} is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SizingError(f"{path}: not UTF-8 text (byte at offset {exc.start})") from None
    except RecursionError:
        raise SizingError(f"{path}: nested too deeply") from None
    if not isinstance(config, dict):
        raise SizingError(f"{path}: expected a JSON object")
    return config
