"""Fixtures of the fault suite (the rig itself is ``tests.faults.rig``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.rig import ControllerProcess


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def controllers() -> Iterator[list[ControllerProcess]]:
    """Controllers a test starts (append them); each is stopped at the end."""
    started: list[ControllerProcess] = []
    yield started
    for controller in started:
        controller.stop()
