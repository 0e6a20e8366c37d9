"""Fixtures for the observability tests: external tools (promtool, prometheus)."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str) -> str:
    """The path of ``name``; without it, fail under CI=true and skip otherwise."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = (
        f"{name} is not installed (Debian's prometheus package); "
        "run `bash scripts/ensure-prometheus` as root, or `make test`"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture
def prometheus_binary() -> str:
    return require_tool("prometheus")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
