"""What the engine model's calls take and give: the engine models, the refusals, the
``Effects`` of a call and the host-cache ``Entry`` a request holds.

Values only; ``state.PodResidency`` changes them (the package docstring says how each
engine behaves). Pure: no IO, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from placement.domain import Engine

__all__ = [
    "AlreadyLoadedError",
    "CapReachedError",
    "Effects",
    "EngineModel",
    "Entry",
    "NotLoadedError",
    "PinLimitError",
    "ResidencyError",
    "engine_model",
]


class EngineModel(enum.StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    SGLANG_HARD_CAP = "sglang-hard-cap"

    @property
    def is_sglang(self) -> bool:
        return self is not EngineModel.VLLM


def engine_model(engine: Engine) -> EngineModel:
    """The model of a pool's engine: SGLang is taken as current SGLang (the soft cap)."""
    return EngineModel.VLLM if engine is Engine.VLLM else EngineModel.SGLANG


class ResidencyError(Exception):
    """A call the engine refuses; the pod's dialect chooses the status code and text."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        super().__init__(adapter)


class AlreadyLoadedError(ResidencyError):
    """The name is loaded already (vLLM 400 without ``load_inplace``; SGLang 400)."""


class NotLoadedError(ResidencyError):
    """The name is not loaded (vLLM: 404 on unload and on requests; SGLang: 400)."""


class CapReachedError(ResidencyError):
    """SGLang before the soft cap: ``--max-loaded-loras`` adapters are loaded already."""


class PinLimitError(ResidencyError):
    """SGLang: pinned adapters may hold at most ``max_loras - 1`` GPU slots."""


@dataclass(frozen=True, kw_only=True)
class Effects:
    """What one call did to the pod, for timing (a cold read, a swap) and for ledgers."""

    #: The weights were read from storage (a cold load).
    cold: bool = False
    #: The adapter took a GPU slot it did not hold (a swap: the batch drains).
    activated: bool = False
    #: Names pushed off the GPU by this call (vLLM ghosts of unloaded names included).
    gpu_evicted: tuple[str, ...] = ()
    #: Names dropped from the host cache (on vLLM still listed; reloaded on next use).
    host_evicted: tuple[str, ...] = ()
    #: SGLang's soft cap: names that left ``/v1/models`` (reloaded on their next request).
    unlisted: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False, slots=True)
class Entry:
    """One host-cache entry: vLLM keys them by id, so an unloaded name can leave one.
    A request holds the entry its name pointed to as it arrived (``PodResidency.entry``).

    Compared and hashed by identity (each is made once, with a fresh id), so the orders
    keyed by entries cost no Python-level ``__hash__`` or ``__eq__`` per lookup."""

    entry_id: int
    name: str
