"""What an emulated engine refuses: one exception per refusal, raised by
``placement.emulator.pod``; the dialect modules turn each into its engine's status code
and text. ``refusal`` maps the engine model's refusals (``placement.residency``) onto
them. No HTTP here.
"""

from __future__ import annotations

from collections.abc import Mapping

from placement import residency


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
