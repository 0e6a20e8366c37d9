"""Fixtures of the pod suites: the anyio backend and emulated fleets."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
