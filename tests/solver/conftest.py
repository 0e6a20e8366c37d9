"""Fixtures of the solver tests: the factories module on the path, the anyio backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
