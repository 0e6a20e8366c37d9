"""What an emulated engine refuses: one exception per refusal, raised by
``placement.emulator.pod``; the dialect modules turn each into its engine's status code
and text. ``refusal`` maps the engine model's refusals (``placement.residency``) onto
them; ``check_load`` is what a load meets before any weights are read. No HTTP here.
"""

from __future__ import annotations

from collections.abc import Mapping

from placement import residency
from placement.emulator.config import AdapterFile, PodConfig, resolve_adapter
from placement.residency import EngineModel, PodResidency


class EmulatorError(Exception):
    """Something the engine refuses; the dialect decides status and text."""


class PodDownError(EmulatorError):
    """The pod is dead (until it comes back empty)."""


class InjectedError(EmulatorError):
    """A failure injected by ``error_rate``."""


class AlreadyLoadedError(EmulatorError): ...


class NotLoadedError(EmulatorError): ...


class BadPathError(EmulatorError): ...


class RankTooLargeError(EmulatorError):
    def __init__(self, rank: int) -> None:
        self.rank = rank
        super().__init__(rank)


class PoolFullError(EmulatorError):
    """SGLang before the soft cap: ``--max-loaded-loras`` adapters are loaded already."""


class PinLimitError(EmulatorError): ...


_REFUSALS: Mapping[type[residency.ResidencyError], type[EmulatorError]] = {
    residency.AlreadyLoadedError: AlreadyLoadedError,
    residency.NotLoadedError: NotLoadedError,
    residency.CapReachedError: PoolFullError,
    residency.PinLimitError: PinLimitError,
}


def refusal(exc: residency.ResidencyError) -> EmulatorError:
    return _REFUSALS[type(exc)]()


def check_load(
    held: PodResidency, config: PodConfig, name: str, path: str, *, pinned: bool, inplace: bool
) -> AdapterFile:
    """The refusals a load of ``name`` from ``path`` meets before any weights are read,
    on a pod that holds ``held``; the adapter file it would read."""
    model = config.model
    if name in held.listed and not (inplace and model is EngineModel.VLLM):
        raise AlreadyLoadedError()
    adapter = resolve_adapter(path, config)
    if adapter is None:
        raise BadPathError()
    if adapter.rank is not None and adapter.rank > config.max_lora_rank:
        raise RankTooLargeError(adapter.rank)
    if model.is_sglang and pinned and len(held.pinned) >= config.max_loras - 1:
        raise PinLimitError()
    cap = config.residency_cap
    hard = model is EngineModel.SGLANG_HARD_CAP
    if hard and cap is not None and len(held.listed) >= cap:
        raise PoolFullError()
    return adapter
