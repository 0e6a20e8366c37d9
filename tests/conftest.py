"""Fixtures shared by every test folder, the Hypothesis profiles, and ``--regen-golden``
(tests/golden/test_golden.py says when to use it).

Property tests run under the Hypothesis profile "ci" unless HYPOTHESIS_PROFILE names
another: "ci" (the default, used by the gate) is derandomized, with no example database,
no deadline nor too_slow health check and 100 examples, so the same examples run on
every machine and a failure prints a blob that replays it; "random"
(``HYPOTHESIS_PROFILE=random``: randomised, 1000 examples, failures kept in .hypothesis/)
is for hunting new counterexamples by hand, each then pinned with ``@example``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"

# too_slow is a timing check as much as the deadline: a busy machine must fail neither
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "random",
    derandomize=False,
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# pytest's --hypothesis-profile, applied after this file is imported, still wins
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--regen-golden",
        action="store_true",
        help="rewrite the golden files in tests/golden/ from this run instead of comparing",
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def repo_root() -> Path:
    return REPO
