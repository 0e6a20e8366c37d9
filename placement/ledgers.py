"""The three ledgers of one replica's GPU memory: base weights, adapter slots, KV cache.

The three-ledger practice (docs/background.md) keeps three ledgers, not one utilisation
figure: the base model's weights and the runtime's own memory are a floor; adapter slots
are a second allocation; the KV cache, which decides how many tokens of requests fit, is
the third. Which one is the remainder depends on the engine:

- **vLLM** preallocates the adapter slots at start: every linear module it supports
  is wrapped (vllm-project/vllm, ``vllm/lora/models.py``,
  ``LoRAModelManager._create_lora_modules``), and each wrapper's ``create_lora_weights``
  allocates stacks of ``max_loras`` x ``max_lora_rank`` for its A and B matrices
  whatever rank the adapters have. The KV cache then gets what is left of
  ``gpu_memory_utilization`` x the device's memory (``ledgers``). ``targets`` names the
  modules wrapped: all seven projections of a Llama layer for vLLM; SGLang allocates
  only its ``--lora-target-modules``.
- **A budget worked by hand**, as docs/background.md does: the KV cache is chosen
  first and the adapters get the remainder (``adapter_budget``): 80 - 35 - 30 - 5 = 10 GB
  holds about 200 rank-16 adapters of 50 MB; 80 GiB - 48 GiB - 4 GiB - 20 GiB = 8 GiB
  holds floor(8,192 / 240) = 34 adapters of 240 MiB.

Base weights are computed from the model's dimensions: the linear layers at the
quantisation's bytes per parameter (scales and zero points ignored), embeddings and
the output head at 16 bits, as AWQ and GPTQ checkpoints keep them. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from placement.domain import TARGET_MODULES, ModelDims
from placement.sizing import BUILTIN_MODELS, SizingError, config_count, dims_from_config

GIB = 2**30

#: Device memory of the GPUs people serve LoRA fleets on, nominal (an "80 GB" card
#: is 80 GiB of HBM; the driver reports a little less, which the utilisation covers).
GPUS: dict[str, int] = {
    "a10g-24gb": 24 * GIB,
    "l4-24gb": 24 * GIB,
    "l40s-48gb": 48 * GIB,
    "a100-40gb": 40 * GIB,
    "a100-80gb": 80 * GIB,
    "h100-80gb": 80 * GIB,
    "h100-94gb": 94 * GIB,
    "h200-141gb": 141 * GIB,
    "b200-192gb": 192 * GIB,
}

#: Bytes per parameter of the base model's linear layers.
QUANT_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

#: Vocabulary sizes and tied embeddings of the built-in models (their config.json).
VOCAB: dict[str, tuple[int, bool]] = {
    "llama-3.1-8b": (128_256, False),
    "llama-3.1-70b": (128_256, False),
    "llama-3.2-1b": (128_256, True),
    "mistral-7b": (32_000, False),
    "qwen2.5-7b": (152_064, False),
}

#: The CUDA workspace, activations and buffers of a 70B replica: about 5 GB.
DEFAULT_ACTIVATION_BYTES = 5 * 10**9


@dataclass(frozen=True, kw_only=True)
class BaseModel:
    dims: ModelDims
    vocab_size: int
    tied_embeddings: bool = False


@dataclass(frozen=True, kw_only=True)
class Ledgers:
    """One replica's memory, in bytes, and what the KV cache left holds in tokens."""

    gpu_bytes: int
    usable_bytes: int
    base_bytes: int
    adapter_slots_bytes: int
    activation_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    kv_tokens: int
    max_model_len: int
    #: Sequences of ``max_model_len`` tokens the KV cache holds at once.
    full_length_sequences: int

    def as_dict(self) -> dict[str, int]:
        return {
            "gpu_bytes": self.gpu_bytes,
            "usable_bytes": self.usable_bytes,
            "base_bytes": self.base_bytes,
            "adapter_slots_bytes": self.adapter_slots_bytes,
            "activation_bytes": self.activation_bytes,
            "kv_bytes": self.kv_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_tokens": self.kv_tokens,
            "max_model_len": self.max_model_len,
            "full_length_sequences": self.full_length_sequences,
        }


@dataclass(frozen=True, kw_only=True)
class AdapterBudget:
    """What a hand-worked budget leaves for adapters, and how many of a size fit."""

    gpu_bytes: int
    base_bytes: int
    kv_bytes: int
    activation_bytes: int
    headroom_bytes: int
    adapter_budget_bytes: int
    adapter_bytes: int
    adapters_fit: int

    def as_dict(self) -> dict[str, int]:
        return {
            "gpu_bytes": self.gpu_bytes,
            "base_bytes": self.base_bytes,
            "kv_bytes": self.kv_bytes,
            "activation_bytes": self.activation_bytes,
            "headroom_bytes": self.headroom_bytes,
            "adapter_budget_bytes": self.adapter_budget_bytes,
            "adapter_bytes": self.adapter_bytes,
            "adapters_fit": self.adapters_fit,
        }


def gpu_bytes(name: str) -> int:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise SizingError(
            f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or give --gpu-bytes, e.g. 80GiB)"
        ) from None


def quant_bytes(name: str) -> float:
    try:
        return QUANT_BYTES[name.lower()]
    except KeyError:
        raise SizingError(
            f"unknown quantisation {name!r}; known: {', '.join(QUANT_BYTES)}"
        ) from None


def builtin_base(name: str) -> BaseModel:
    dims = BUILTIN_MODELS.get(name.lower())
    if dims is None:
        raise SizingError(
            f"unknown base model {name!r}; known: {', '.join(BUILTIN_MODELS)}, "
            "or give the model's Hugging Face config.json with --config"
        )
    vocab, tied = VOCAB[dims.name]
    return BaseModel(dims=dims, vocab_size=vocab, tied_embeddings=tied)


def base_weight_bytes(model: BaseModel, quant: str) -> int:
    """The base model's weights: linear layers at ``quant``, embeddings at 16 bits."""
    dims = model.dims
    per_layer = sum(
        dims.projection_shape(module)[0] * dims.projection_shape(module)[1]
        for module in TARGET_MODULES
    )
    linear = per_layer * dims.num_layers
    embeddings = model.vocab_size * dims.hidden_size * (1 if model.tied_embeddings else 2)
    norms = (2 * dims.num_layers + 1) * dims.hidden_size
    return round(linear * quant_bytes(quant)) + 2 * (embeddings + norms)


def adapter_slots_bytes(
    dims: ModelDims,
    *,
    max_loras: int,
    max_lora_rank: int,
    targets: tuple[str, ...],
    dtype_bytes: int,
) -> int:
    """What an engine preallocates for ``max_loras`` adapters of rank up to ``max_lora_rank``."""
    if max_loras < 1 or max_lora_rank < 1:
        raise SizingError("max_loras and max_lora_rank must be at least 1")
    per_layer = sum(sum(dims.projection_shape(module)) for module in targets)
    return max_loras * max_lora_rank * per_layer * dims.num_layers * dtype_bytes


def kv_bytes_per_token(dims: ModelDims, *, kv_dtype_bytes: int = 2) -> int:
    """Keys and values of one token in every layer."""
    return 2 * dims.num_layers * dims.num_kv_heads * dims.head_dim * kv_dtype_bytes


def ledgers(
    model: BaseModel,
    *,
    device_bytes: int,
    quant: str,
    max_loras: int,
    max_lora_rank: int,
    targets: tuple[str, ...] = TARGET_MODULES,
    max_model_len: int = 8192,
    gpu_memory_utilization: float = 0.9,
    activation_bytes: int = DEFAULT_ACTIVATION_BYTES,
    base_bytes: int | None = None,
    lora_dtype_bytes: int = 2,
    kv_dtype_bytes: int = 2,
) -> Ledgers:
    """The three ledgers as vLLM lays them out: the KV cache gets what is left."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise SizingError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if max_model_len < 1:
        raise SizingError(f"max_model_len must be at least 1, got {max_model_len}")
    usable = int(device_bytes * gpu_memory_utilization)
    base = base_weight_bytes(model, quant) if base_bytes is None else base_bytes
    slots = adapter_slots_bytes(
        model.dims,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        targets=targets,
        dtype_bytes=lora_dtype_bytes,
    )
    kv = usable - base - slots - activation_bytes
    if kv <= 0:
        raise SizingError(
            f"nothing left for the KV cache: {_gib(usable)} usable - {_gib(base)} base - "
            f"{_gib(slots)} adapter slots - {_gib(activation_bytes)} activations = "
            f"{_gib(kv)}; use fewer or smaller slots, a smaller quantisation, or a larger GPU"
        )
    per_token = kv_bytes_per_token(model.dims, kv_dtype_bytes=kv_dtype_bytes)
    tokens = kv // per_token
    if tokens < max_model_len:
        raise SizingError(
            f"the KV cache holds {tokens:,} tokens, less than one sequence of "
            f"max_model_len {max_model_len:,}: vLLM refuses to start so"
        )
    return Ledgers(
        gpu_bytes=device_bytes,
        usable_bytes=usable,
        base_bytes=base,
        adapter_slots_bytes=slots,
        activation_bytes=activation_bytes,
        kv_bytes=kv,
        kv_bytes_per_token=per_token,
        kv_tokens=tokens,
        max_model_len=max_model_len,
        full_length_sequences=tokens // max_model_len,
    )


def adapter_budget(
    *,
    device_bytes: int,
    base_bytes: int,
    kv_bytes: int,
    adapter_bytes: int,
    activation_bytes: int = 0,
    headroom_bytes: int = 0,
) -> AdapterBudget:
    """The KV cache chosen first, the adapters get the rest (docs/background.md)."""
    if adapter_bytes < 1:
        raise SizingError("the adapter size must be at least one byte")
    budget = device_bytes - base_bytes - kv_bytes - activation_bytes - headroom_bytes
    if budget < 0:
        raise SizingError(
            f"the budget is negative: {_gib(device_bytes)} - {_gib(base_bytes)} base - "
            f"{_gib(kv_bytes)} KV - {_gib(activation_bytes)} activations - "
            f"{_gib(headroom_bytes)} headroom = {_gib(budget)}"
        )
    return AdapterBudget(
        gpu_bytes=device_bytes,
        base_bytes=base_bytes,
        kv_bytes=kv_bytes,
        activation_bytes=activation_bytes,
        headroom_bytes=headroom_bytes,
        adapter_budget_bytes=budget,
        adapter_bytes=adapter_bytes,
        adapters_fit=budget // adapter_bytes,
    )


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def base_from_config(config: dict[str, object], *, source: str) -> BaseModel:
    """A base model from a Hugging Face ``config.json``'s parsed object."""
    dims = dims_from_config(config, source=source, name=str(config.get("_name_or_path") or source))
    vocab = config_count(config, "vocab_size", source=source)
    return BaseModel(
        dims=dims, vocab_size=vocab, tied_embeddings=bool(config.get("tie_word_embeddings", False))
    )
