"""Fixtures of the pod suites: the anyio backend and emulated fleets.

``emulated`` is a factory other suites can copy: ``fleet = emulated(4, engine=...)``
gives pods named pod-0.. in-process, ``fleet.http()`` reaches them without sockets.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from placement.clock import ManualClock
from placement.domain import Engine
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig

EmulatedFactory = Callable[..., EmulatedFleet]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def emulated() -> EmulatedFactory:
    def make(
        n: int = 1,
        *,
        engine: Engine = Engine.VLLM,
        clock: ManualClock | None = None,
        **config: object,
    ) -> EmulatedFleet:
        template = PodConfig(latency=ZERO_LATENCY, **config)  # type: ignore[arg-type]
        return EmulatedFleet.start(n, engine=engine, config=template, clock=clock or ManualClock())

    return make
