"""docs/reliability.md names, for each attack, the test that holds it: each such test
exists, and every test of this fault suite is named there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DOC = TESTS.parent / "docs" / "reliability.md"
REFERENCE = re.compile(r"`((?:faults|controller|deploy|inputs)/[\w/]+\.py)::(test_\w+)`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_test_the_document_names_exists() -> None:
    named = REFERENCE.findall(DOC.read_text())
    assert len(named) > 30
    missing = [f"{f}::{t}" for f, t in named if t not in _tests_in(TESTS / f)]
    assert missing == []


def test_every_fault_test_is_in_the_document() -> None:
    named = {(f, t) for f, t in REFERENCE.findall(DOC.read_text())}
    unlisted = [
        f"faults/{path.name}::{name}"
        for path in sorted((TESTS / "faults").glob("test_*.py"))
        if path.name != Path(__file__).name
        for name in sorted(_tests_in(path))
        if (f"faults/{path.name}", name) not in named
    ]
    assert unlisted == []
