"""The settings tree refuses values its readers cannot use, naming the field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from placement.settings import RouterSettings, Settings


@pytest.mark.parametrize("every", [0, -1])
def test_a_listing_every_zero_scrapes_is_refused_by_name(every: int) -> None:
    with pytest.raises(ValueError, match=r"RouterSettings\.listing_every_scrapes .* got "):
        RouterSettings(listing_every_scrapes=every)
    with pytest.raises(ValueError, match="listing_every_scrapes"):
        replace(Settings().router, listing_every_scrapes=every)


@pytest.mark.parametrize("every", [1, 8, 10_000])
def test_a_listing_every_n_scrapes_is_kept(every: int) -> None:
    assert RouterSettings(listing_every_scrapes=every).listing_every_scrapes == every


@pytest.mark.parametrize("seconds", [0.0, -4.0, float("nan")])
def test_an_upstream_keepalive_that_is_not_positive_is_refused_by_name(seconds: float) -> None:
    with pytest.raises(ValueError, match=r"RouterSettings\.upstream_keepalive_s .* got "):
        RouterSettings(upstream_keepalive_s=seconds)
