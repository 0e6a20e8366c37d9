"""Synthetic workloads: deterministic for a seed, and shaped as the scenarios say."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli import app
from placement.inputs import load_catalog, load_fleet, load_pipelines
from placement.synth.generate import generate
from placement.synth.scenario import load_scenario

runner = CliRunner()


@pytest.fixture(scope="module")
def war_story(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    folder = Path(__file__).resolve().parents[2] / "data" / "war-story"
    files = load_scenario(folder / "scenario.yaml")
    catalog = load_catalog(files.catalog, fleet=load_fleet(files.fleet))
    pipelines = load_pipelines(folder / "pipelines.yaml", catalog=catalog)
    from dataclasses import replace

    scenario = replace(files.scenario, requests_per_minute=40)
    return generate(scenario, catalog, rng=np.random.default_rng(3), pipelines=pipelines)


def test_same_seed_writes_the_same_log(tmp_path: Path, repo_root: Path) -> None:
    scenario = str(repo_root / "data" / "legal-research" / "scenario.yaml")
    for name in ("a.parquet", "b.parquet"):
        result = runner.invoke(
            app, ["synth", scenario, "--days", "0.5", "--seed", "7", "-o", str(tmp_path / name)]
        )
        assert result.exit_code == 0, result.output
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    other = tmp_path / "c.parquet"
    runner.invoke(app, ["synth", scenario, "--days", "0.5", "--seed", "8", "-o", str(other)])
    assert other.read_bytes() != (tmp_path / "a.parquet").read_bytes()


def test_popularity_is_a_power_law(war_story: pd.DataFrame) -> None:
    shares = war_story["adapter"].value_counts(normalize=True)
    assert shares.iloc[0] > 5 * shares.iloc[19]
    assert shares.head(10).sum() > 0.5


def test_experiment_variants_start_thursday_1015_new_york(war_story: pd.DataFrame) -> None:
    variants = war_story[war_story["adapter"].astype(str).str.endswith("-experiment")]
    assert len(variants) > 0
    first = variants["ts"].min().tz_convert("America/New_York")
    assert (first.day_name(), first.hour, first.minute) == ("Thursday", 10, 15)


def test_customer_support_es_peaks_in_mexico_city_business_hours(war_story: pd.DataFrame) -> None:
    local = war_story.loc[war_story["adapter"] == "customer-support-es", "ts"].dt.tz_convert(
        "America/Mexico_City"
    )
    by_hour = local.dt.hour.value_counts().sort_index()
    assert by_hour.loc[list(range(9, 18))].mean() > 2.5 * by_hour.loc[[0, 1, 2, 3, 4, 5]].mean()


def test_pipeline_follow_ups_come_after_the_classifier(war_story: pd.DataFrame) -> None:
    frame = war_story.sort_values("ts")
    classifier = frame.loc[frame["adapter"] == "doc-classifier-v2", "ts"].to_numpy()
    extracts = frame.loc[
        frame["adapter"].isin(["legal-extract-v3", "medical-extract-v1"]), "ts"
    ].to_numpy()
    gaps = extracts - classifier[np.searchsorted(classifier, extracts, side="right") - 1]
    share_within = np.mean(gaps <= np.timedelta64(150, "s"))
    assert share_within > 0.5


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param("name: x\n", "start: Field required", id="missing-start"),
        pytest.param(
            "start: '2026-03-10T00:00:00'\nrequests_per_minute: lots\n",
            "requests_per_minute: Input should be a valid number",
            id="not-a-number",
        ),
        pytest.param(
            "start: '2026-03-10T00:00:00'\nexperiments: [{of_top: 3}]\n",
            "experiments.0.start: Field required",
            id="nested-field",
        ),
        pytest.param(
            "start: '2026-03-10T00:00:00'\nbusiness_hours: [18, 9]\n",
            "expected 0 <= start < end <= 24",
            id="hours-backwards",
        ),
        pytest.param(
            "start: '2026-03-10T00:00:00'\n", "catalog.yaml does not exist", id="no-catalog"
        ),
    ],
)
def test_bad_scenario_is_reported(tmp_path: Path, body: str, expected: str) -> None:
    (tmp_path / "scenario.yaml").write_text(body)
    result = runner.invoke(
        app, ["synth", str(tmp_path / "scenario.yaml"), "-o", str(tmp_path / "o.parquet")]
    )
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output
