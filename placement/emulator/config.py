"""What an emulated pod is configured with, and which adapters "exist" for it.

The engine model (``placement.residency.EngineModel``) decides what a load, an unload
and a request do to the pod; the version knobs choose among the wire forms real engines
of different ages answer with (POD-API.md): vLLM's error body (nested ``{"error": {...}}``
now, flat before) and KV gauge name (``vllm:kv_cache_usage_perc`` now,
``vllm:gpu_cache_usage_perc`` before vllm-project/vllm#18354); SGLang's ``--enable-metrics``
(off: ``/metrics`` answers 404), ``--dp-size`` (above 1 a load fails an assertion: 500)
and its request naming (``model: "<base>:<adapter>"`` since sgl-project/sglang#11570;
older engines read only ``lora_path`` and run the base model for anything else).

Adapter existence: a ``lora_path`` is missing when it matches ``missing_pattern``
(default: a path segment starting with ``missing``), or when it is a local path
(``/``, ``./``, ``../``, ``~`` or ``file://``) that does not exist. A local PEFT
directory gives the adapter's size (its files) and rank (``r`` in
``adapter_config.json``); anything else has ``default_adapter_bytes`` and no rank.

Where the weights come from (``storage``): neither engine fetches from a bucket itself.
vLLM reads ``lora_path`` as a local directory (or a Hugging Face repo it downloads), and
for a name it does not know asks its LoRA resolver plugins (``vllm/lora/resolver.py``;
the filesystem resolver, ``vllm/plugins/lora_resolvers/filesystem_resolver.py``, looks
under ``VLLM_LORA_RESOLVER_CACHE_DIR``); SGLang's ``LoRAManager.load_lora_adapter``
(``python/sglang/srt/lora/lora_manager.py``) reads the path it is given. A pool whose
adapters live on a network volume or in object storage reaches them through such a
path (a mount, a bucket behind FUSE, a resolver that downloads), so a cold read waits
for that storage: its first byte, then size / bandwidth. That time is the storage's,
not the engine's: with ``storage`` set, a cold read takes ``Latency.load_ms`` (the
engine's own fixed part) plus the storage's fetch, in place of ``load_ms_per_mb`` (the
read rate of local NVMe, what a pool without ``storage`` keeps).

The batch (``batch``, a ``BatchTiming``): without one a request runs at once and its
times are ``Latency``'s fixed ``ttft_ms`` and ``tpot_ms``. With one, the pod is the
replay's pod (``placement.sim.engine``, parameters from ``SimSettings``), which is what
vLLM's engine does: at most ``max_num_seqs`` requests run, the rest wait in arrival order
(``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule`` stops taking waiting
requests when ``len(self.running) == self.max_num_running_reqs``); the prefill grows
with the prompt's tokens; and a decode step grows with the batch (more tokens in one
forward) and with the distinct adapters in it (the LoRA kernels run one segment per
adapter: ``vllm/lora/punica_wrapper/punica_base.py`` over ``vllm/lora/utils.py``
``compute_meta``). ``Latency``'s fixed times are then added on top (0 in the demo).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from placement.domain import VLLM_MAX_LORA_RANKS, AdapterStorage, Engine
from placement.residency import EngineModel, engine_model
from placement.settings import SimSettings

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
class BatchTiming:
    """The replay's batch model, in milliseconds: no defaults here, they are
    ``SimSettings``' (``of``), or the flags the demo fills from them."""

    max_num_seqs: int
    prefill_ms_per_token: float
    decode_ms_per_step: float
    batch_step_slowdown: float
    adapter_step_cost: float

    @classmethod
    def of(cls, sim: SimSettings) -> BatchTiming:
        return cls(
            max_num_seqs=sim.max_num_seqs,
            prefill_ms_per_token=sim.prefill_ms_per_token,
            decode_ms_per_step=sim.decode_ms_per_step,
            batch_step_slowdown=sim.batch_step_slowdown,
            adapter_step_cost=sim.adapter_step_cost,
        )

    def prefill_ms(self, prompt_tokens: int) -> float:
        return self.prefill_ms_per_token * prompt_tokens

    def step_ms(self, *, running: int, adapters: int) -> float:
        """One decode step with ``running`` requests in the batch over ``adapters``
        distinct adapters (the base model's requests are no segment of their own)."""
        batch = 1.0 + self.batch_step_slowdown * running / self.max_num_seqs
        diversity = 1.0 + self.adapter_step_cost * max(0, adapters - 1)
        return self.decode_ms_per_step * batch * diversity

    def problems(self) -> list[str]:
        found = []
        if self.max_num_seqs < 1:
            found.append(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        for name in (
            "prefill_ms_per_token",
            "decode_ms_per_step",
            "batch_step_slowdown",
            "adapter_step_cost",
        ):
            value = getattr(self, name)
            if not value >= 0:
                found.append(f"{name} must be 0 or more, got {value}")
        return found


@dataclass(frozen=True, kw_only=True)
class Faults:
    """Injected failures: a share of calls answered 5xx, and extra time on each load."""

    error_rate: float = 0.0
    slow_load_ms: float = 0.0


VLLM_KV_METRIC = "vllm:kv_cache_usage_perc"
#: The KV gauge's name before vllm-project/vllm#18354.
VLLM_OLD_KV_METRIC = "vllm:gpu_cache_usage_perc"


@dataclass(frozen=True, kw_only=True)
class PodConfig:
    name: str = "pod-0"
    #: The dialect the pod speaks.
    engine: Engine = Engine.VLLM
    #: What the engine does with loads, unloads and requests; None: the current
    #: model of ``engine`` (vLLM, or SGLang with the soft cap).
    engine_model: EngineModel | None = None
    served_model_name: str = "base-model"
    model_path: str = "/models/base-model"
    max_loras: int = 1
    #: vLLM's ``--max-cpu-loras`` (None: ``max_loras``, as in vLLM); SGLang's
    #: ``--max-loaded-loras`` (None: no cap, as in SGLang).
    max_cpu_loras: int | None = None
    max_lora_rank: int = 16
    #: vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING; off, the LoRA routes are not mounted.
    runtime_lora_updating: bool = True
    #: SGLang's --enable-lora.
    enable_lora: bool = True
    #: vLLM before the nested error body: ``{"message", "type", "param", "code"}``.
    vllm_flat_errors: bool = False
    #: vLLM before vllm-project/vllm#18354 names its KV gauge ``vllm:gpu_cache_usage_perc``.
    vllm_old_kv_metric: bool = False
    #: SGLang's --enable-metrics; off, ``/metrics`` is not mounted (404).
    sglang_metrics: bool = True
    #: SGLang's --dp-size; above 1 every load or unload fails an assertion (500).
    sglang_dp_size: int = 1
    #: SGLang since sgl-project/sglang#11570 reads ``model: "<base>:<adapter>"``; older
    #: engines read only ``lora_path`` and run the base model for any other ``model``.
    sglang_model_naming: bool = True
    missing_pattern: str = r"(^|[/:])missing"
    default_adapter_bytes: int = 50 * MB
    kv_capacity_tokens: int = 65536
    latency: Latency = field(default_factory=Latency)
    #: The running batch's cap and timing (the replay's); None: requests run at once,
    #: at ``latency``'s fixed times.
    batch: BatchTiming | None = None
    #: Where cold reads fetch adapters from (fleet.yaml's pool ``storage``); None: local
    #: NVMe at ``latency.load_ms_per_mb``.
    storage: AdapterStorage | None = None
    faults: Faults = field(default_factory=Faults)
    seed: int = 0

    def first_token_ms(self, prompt_tokens: int) -> float:
        """``ttft_ms``, plus the batch model's prefill of the prompt."""
        batch = self.batch
        return self.latency.ttft_ms + (0.0 if batch is None else batch.prefill_ms(prompt_tokens))

    def decode_step_ms(self, running: Mapping[str, int]) -> float:
        """One decode step of the batch ``running`` (requests per adapter name; "": the
        base model): ``tpot_ms``, plus the batch model's step for its size and distinct
        adapters."""
        if self.batch is None:
            return self.latency.tpot_ms
        adapters = sum(1 for name, count in running.items() if count > 0 and name)
        step_ms = self.batch.step_ms(running=sum(running.values()), adapters=adapters)
        return self.latency.tpot_ms + step_ms

    def cold_read_ms(self, size_bytes: int) -> float:
        """Milliseconds to read an adapter that is not in host memory: the engine's fixed
        part, then the storage's first byte and transfer (or NVMe's per-MB rate)."""
        if self.storage is None:
            return self.latency.cold_ms(size_bytes)
        fetch_ms = self.storage.first_byte_ms + 1000.0 * size_bytes / self.storage.bytes_per_s
        return self.latency.load_ms + fetch_ms

    def storage_stats(self) -> dict[str, object] | None:
        """Where cold reads fetch from, as ``/admin/stats`` shows it (None: local NVMe)."""
        if self.storage is None:
            return None
        return {
            "kind": self.storage.kind,
            "bandwidth_per_s": self.storage.bytes_per_s,
            "first_byte_ms": self.storage.first_byte_ms,
        }

    @property
    def cpu_slots(self) -> int:
        """The host-cache size lorafleet plans with (``max_loras`` when none is set)."""
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    @property
    def model(self) -> EngineModel:
        """The engine model in force: ``engine_model``, else ``engine``'s current one."""
        return self.engine_model or engine_model(self.engine)

    @property
    def residency_cap(self) -> int | None:
        """``max_cpu_loras`` as the engine model takes it: SGLang has no cap unless set."""
        return self.max_cpu_loras if self.model.is_sglang else self.cpu_slots

    @property
    def kv_metric(self) -> str:
        return VLLM_OLD_KV_METRIC if self.vllm_old_kv_metric else VLLM_KV_METRIC

    def _host_below_gpu(self) -> str:
        """The engine's refusal of fewer host (SGLang: loaded) slots than GPU slots, in
        its words: vllm-project/vllm vllm/config/lora.py
        ``LoRAConfig._validate_lora_config``; sgl-project/sglang
        python/sglang/srt/server_args.py ``ServerArgs.check_lora_server_args`` (an
        assert, when ``--max-loaded-loras`` is set). Both refuse to start. vLLM's reason
        shows in its caches: the CPU cache (``max_cpu_loras`` entries) deactivates an
        adapter it drops (vllm/lora/models.py, now model_manager.py,
        ``AdapterLRUCache._on_remove`` -> ``deactivate_adapter``), so every adapter on a
        GPU slot is one of its entries and slots past ``max_cpu_loras`` could never fill.
        SGLang's assert gives no reason."""
        if self.engine is Engine.SGLANG:
            return (
                "max_loaded_loras should be greater than or equal to max_loras_per_batch. "
                f"max_loaded_loras={self.cpu_slots}, max_loras_per_batch={self.max_loras}"
            )
        return f"max_cpu_loras ({self.cpu_slots}) must be >= max_loras ({self.max_loras})"

    def problems(self) -> list[str]:
        """What a real engine would refuse to start with."""
        found = []
        if self.max_loras < 1:
            found.append(f"max_loras must be at least 1, got {self.max_loras}")
        if self.cpu_slots < self.max_loras:
            found.append(self._host_below_gpu())
        if self.engine is Engine.VLLM and self.max_lora_rank not in VLLM_MAX_LORA_RANKS:
            found.append(f"max_lora_rank must be one of {VLLM_MAX_LORA_RANKS}")
        if self.model.is_sglang != (self.engine is Engine.SGLANG):
            found.append(f"engine model {self.model.value} does not speak {self.engine.value}")
        if self.sglang_dp_size < 1:
            found.append(f"dp_size must be at least 1, got {self.sglang_dp_size}")
        storage = self.storage
        if storage is not None and not storage.bytes_per_s > 0:
            found.append(f"storage bandwidth must be above 0, got {storage.bytes_per_s}")
        if storage is not None and not storage.first_byte_ms >= 0:
            found.append(f"storage first_byte_ms must be 0 or more, got {storage.first_byte_ms}")
        if self.batch is not None:
            found += self.batch.problems()
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
