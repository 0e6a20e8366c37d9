"""Comments and docstrings state facts, not where they came from.

The design documents ("seed 000", "issue 5") are not in the repository, so a pointer
to them tells a reader nothing. The facts and their sources live in
``docs/background.md``; code says the fact. This test reads every comment and string
literal (docstrings, help texts, messages) under the packages and fails on a citation.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("placement", "models", "policies")

#: "seed 000", "seed_001", "Seed 003's"; "issue 5", "issue-8", "issue #3". A random
#: seed ("seed 0", "seed=7") is not a citation.
CITATION = re.compile(r"\bseed[\s_-]*0\d+|\bissues?[\s-]*#?\d+", re.IGNORECASE)

#: Tokens that hold prose: comments, and strings (f-string parts on Python 3.12+).
PROSE = {tokenize.COMMENT, tokenize.STRING} | (
    {tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE") else set()
)


def citations(source: str) -> list[tuple[int, str]]:
    """(line, cited text) for every citation in the comments and strings of ``source``."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in PROSE:
            continue
        for match in CITATION.finditer(token.string):
            line = token.start[0] + token.string.count("\n", 0, match.start())
            found.append((line, match.group()))
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param('"""Seed 000\'s five phases."""\n', [(1, "Seed 000")], id="docstring"),
        pytest.param("x = 1  # the pool (seed\n", [], id="comment-without-number"),
        pytest.param('"""A window (seed\n000) of 10 min."""\n', [(1, "seed\n000")], id="wrapped"),
        pytest.param("x = 1\n# (issue 5) replay\n", [(2, "issue 5")], id="comment"),
        pytest.param('HELP = "see issue-8"\n', [(1, "issue-8")], id="help-string"),
        pytest.param("# random seed 0, seed=7, seed 42\n", [], id="random-seed"),
        pytest.param("seed_000 = 0  # a name, not prose\n", [], id="identifier"),
    ],
)
def test_citations_are_found_in_comments_and_strings_only(
    source: str, expected: list[tuple[int, str]]
) -> None:
    assert citations(source) == expected


def test_no_comment_or_docstring_cites_a_document_the_repository_does_not_hold() -> None:
    files = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    assert files, "no source files found"
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in files
        for line, text in citations(path.read_text(encoding="utf-8"))
    ]
    assert not found, "state the fact (sources: docs/background.md):\n" + "\n".join(found)
