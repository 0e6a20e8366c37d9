"""What an emulated pod is configured with, and which adapters "exist" for it.

Adapter existence: a ``lora_path`` is missing when it matches ``missing_pattern``
(default: a path segment starting with ``missing``), or when it is a local path
(``/``, ``./``, ``../``, ``~`` or ``file://``) that does not exist. A local PEFT
directory gives the adapter's size (its files) and rank (``r`` in
``adapter_config.json``); anything else has ``default_adapter_bytes`` and no rank.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from placement.domain import VLLM_MAX_LORA_RANKS, Engine

MB = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Latency:
    """Simulated times; small by default so that tests are fast."""

    load_ms: float = 2.0
    load_ms_per_mb: float = 0.02
    activate_ms: float = 0.5
    activate_ms_per_mb: float = 0.01
    ttft_ms: float = 1.0
    tpot_ms: float = 0.2

    def cold_ms(self, size_bytes: int) -> float:
        return self.load_ms + self.load_ms_per_mb * size_bytes / MB

    def swap_ms(self, size_bytes: int) -> float:
        return self.activate_ms + self.activate_ms_per_mb * size_bytes / MB


ZERO_LATENCY = Latency(
    load_ms=0.0,
    load_ms_per_mb=0.0,
    activate_ms=0.0,
    activate_ms_per_mb=0.0,
    ttft_ms=0.0,
    tpot_ms=0.0,
)


@dataclass(frozen=True, kw_only=True)
class Faults:
    """Injected failures: a share of calls answered 5xx, and extra time on each load."""

    error_rate: float = 0.0
    slow_load_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class PodConfig:
    name: str = "pod-0"
    engine: Engine = Engine.VLLM
    served_model_name: str = "base-model"
    model_path: str = "/models/base-model"
    max_loras: int = 1
    #: Defaults to ``max_loras`` as in vLLM (SGLang's ``--max-loaded-loras``).
    max_cpu_loras: int | None = None
    max_lora_rank: int = 16
    #: vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING; off, the LoRA routes are not mounted.
    runtime_lora_updating: bool = True
    #: SGLang's --enable-lora.
    enable_lora: bool = True
    missing_pattern: str = r"(^|[/:])missing"
    default_adapter_bytes: int = 50 * MB
    kv_capacity_tokens: int = 65536
    latency: Latency = field(default_factory=Latency)
    faults: Faults = field(default_factory=Faults)
    seed: int = 0

    @property
    def cpu_slots(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    def problems(self) -> list[str]:
        """What a real engine would refuse to start with."""
        found = []
        if self.max_loras < 1:
            found.append(f"max_loras must be at least 1, got {self.max_loras}")
        if self.cpu_slots < self.max_loras:
            found.append(f"max_cpu_loras ({self.cpu_slots}) must be >= max_loras")
        if self.engine is Engine.VLLM and self.max_lora_rank not in VLLM_MAX_LORA_RANKS:
            found.append(f"max_lora_rank must be one of {VLLM_MAX_LORA_RANKS}")
        return found


@dataclass(frozen=True, kw_only=True)
class AdapterFile:
    path: str
    size_bytes: int
    rank: int | None = None


def _is_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~", "file://"))


def resolve_adapter(path: str, config: PodConfig) -> AdapterFile | None:
    """The adapter at ``path``, or None when the engine would not find one."""
    if re.search(config.missing_pattern, path):
        return None
    if not _is_local(path):
        return AdapterFile(path=path, size_bytes=config.default_adapter_bytes)
    local = Path(path.removeprefix("file://")).expanduser()
    if not local.exists():
        return None
    if local.is_file():
        return AdapterFile(path=path, size_bytes=local.stat().st_size)
    size = sum(item.stat().st_size for item in local.iterdir() if item.is_file())
    rank = None
    config_file = local / "adapter_config.json"
    if config_file.is_file():
        try:
            raw_rank = json.loads(config_file.read_text()).get("r")
        except (json.JSONDecodeError, AttributeError):
            raw_rank = None
        rank = raw_rank if isinstance(raw_rank, int) else None
    return AdapterFile(path=path, size_bytes=size or config.default_adapter_bytes, rank=rank)
