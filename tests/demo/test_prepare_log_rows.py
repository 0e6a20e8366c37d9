"""The demo's ``prepare`` names a bad row of the scenario's Parquet log by its row in
the file, not by its place in the replayed window it cut from the file."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pandas as pd
import pytest

from placement.demo.prepare import DemoOptions, prepare
from placement.errors import InputError

LEGAL = Path(__file__).resolve().parents[2] / "data" / "legal-research"


def test_a_bad_row_in_the_window_is_named_by_its_row_in_the_file(tmp_path: Path) -> None:
    """prepare checks only the window it replays, and named a bad row there by its place
    in the window ("row 6" of the 14 requests of 08:53-08:55), not in the file."""
    scenario = tmp_path / "scenario"
    shutil.copytree(LEGAL, scenario)
    log = pd.read_parquet(scenario / "requests.parquet")
    opened = pd.Timestamp("2026-03-11T08:53", tz="America/New_York")
    place = int((log["ts"] < opened).sum()) + 5  # the window's sixth request
    log.loc[place, "prompt_tokens"] = -1
    log.index = pd.RangeIndex(7, 7 + len(log))  # an index stored with the file: no place
    log.to_parquet(scenario / "requests.parquet")
    options = DemoOptions(
        scenario=scenario,
        day=date(2026, 3, 11),
        window_hours=(8 + 53 / 60, 8 + 55 / 60),
        warmup_s=0.0,
    )
    with pytest.raises(InputError) as raised:
        prepare(options, tmp_path / "work")
    assert [str(p) for p in raised.value.problems] == [
        f"{scenario / 'requests.parquet'}: row {place + 1}: prompt_tokens: 1 negative values"
    ]
