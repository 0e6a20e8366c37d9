"""Adapter and pod names: lower-case DNS labels, matched whole."""

from __future__ import annotations

import pytest

from placement.inputs.fields import is_dns_label


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        pytest.param("legal-assistant-v2", True, id="label"),
        pytest.param("a", True, id="one-char"),
        pytest.param("a" * 63, True, id="63-chars"),
        pytest.param("a" * 64, False, id="64-chars"),
        pytest.param("alpha\n", False, id="trailing-newline"),
        pytest.param("Alpha", False, id="upper-case"),
        pytest.param("-alpha", False, id="leading-dash"),
        pytest.param("alpha-", False, id="trailing-dash"),
        pytest.param("", False, id="empty"),
    ],
)
def test_a_name_is_a_dns_label_matched_whole(name: str, ok: bool) -> None:
    assert is_dns_label(name) is ok
