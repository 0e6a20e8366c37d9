"""Synthetic workloads: deterministic for a seed, and shaped as the scenarios say."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import Adapter, AdapterId, Catalog, TenantId
from placement.inputs import load_catalog, load_fleet, load_pipelines
from placement.synth.generate import Experiment, Scenario, generate
from placement.synth.scenario import load_scenario

runner = CliRunner()


@pytest.fixture(scope="module")
def war_story(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    folder = Path(__file__).resolve().parents[2] / "data" / "war-story"
    files = load_scenario(folder / "scenario.yaml")
    catalog = load_catalog(files.catalog, fleet=load_fleet(files.fleet))
    pipelines = load_pipelines(folder / "pipelines.yaml", catalog=catalog)
    scenario = replace(files.scenario, requests_per_minute=40)
    return generate(scenario, catalog, rng=np.random.default_rng(3), pipelines=pipelines).requests


def test_same_seed_writes_the_same_log_and_events(tmp_path: Path, repo_root: Path) -> None:
    scenario = str(repo_root / "data" / "legal-research" / "scenario.yaml")
    for name in ("a", "b", "c"):
        seed = "8" if name == "c" else "7"
        result = runner.invoke(
            app,
            [
                "synth",
                scenario,
                "--days",
                "2",  # legal-research opens on a Sunday: Monday's logins make the events
                "--seed",
                seed,
                "-o",
                str(tmp_path / f"{name}.parquet"),
            ],
        )
        assert result.exit_code == 0, result.output
    for suffix in (".parquet", ".events.parquet"):
        same = (tmp_path / f"a{suffix}").read_bytes()
        assert same == (tmp_path / f"b{suffix}").read_bytes(), suffix
        assert same != (tmp_path / f"c{suffix}").read_bytes(), suffix


@pytest.mark.parametrize("scenario", ["code-assistant", "legal-research"])
def test_the_shipped_logs_are_what_seed_1_writes(repo_root: Path, scenario: str) -> None:
    """data/ is generated with ``--seed 1`` (the two small scenarios are checked here;
    the war story and saas-50 take seconds each to generate)."""
    folder = repo_root / "data" / scenario
    files = load_scenario(folder / "scenario.yaml")
    catalog = load_catalog(files.catalog, fleet=load_fleet(files.fleet))
    pipelines = load_pipelines(files.pipelines, catalog=catalog) if files.pipelines else None
    synthetic = generate(files.scenario, catalog, rng=np.random.default_rng(1), pipelines=pipelines)
    shipped = pd.read_parquet(folder / "requests.parquet")
    assert len(synthetic.requests) == len(shipped)
    assert (synthetic.requests["ts"].to_numpy() == shipped["ts"].to_numpy()).all()


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


def _small(**changes: Any) -> tuple[Scenario, Catalog]:
    catalog = Catalog(
        adapters=tuple(
            Adapter(
                name=AdapterId(f"a{i}"),
                base_model="llama-3.1-8b",
                rank=8,
                alpha=8,
                target_modules=("q_proj", "v_proj"),
                dtype="float16",
                source=f"/adapters/a{i}",
                size_bytes=10_000_000,
                tenant=TenantId(f"t{i}"),
            )
            for i in range(4)
        )
    )
    scenario = Scenario(
        name="small",
        start=datetime(2026, 3, 9, 5, tzinfo=UTC),  # Monday 00:00 in New York
        days=7,
        requests_per_minute=30,
        timezone="America/New_York",
        interarrival_cv=1.0,
    )
    return replace(scenario, **changes), catalog


def test_a_week_has_weekends_at_the_weekend_level() -> None:
    scenario, catalog = _small(weekend_level=0.2)
    requests = generate(scenario, catalog, rng=np.random.default_rng(1)).requests
    local = requests["ts"].dt.tz_convert("America/New_York")
    per_day = local.dt.dayofweek.value_counts().sort_index()
    weekend, weekday = per_day.loc[[5, 6]].mean(), per_day.loc[[0, 1, 2, 3, 4]].mean()
    assert 0.17 < weekend / weekday < 0.23


def test_a_daily_profile_shapes_the_hours() -> None:
    profile = ((0.0, 0.1), (6.0, 0.1), (15.0, 1.0), (20.0, 0.1))
    scenario, catalog = _small(days=1, profile=profile)
    requests = generate(scenario, catalog, rng=np.random.default_rng(1)).requests
    hours = requests["ts"].dt.tz_convert("America/New_York").dt.hour.value_counts()
    assert hours.loc[15] > 6 * hours.loc[3]
    assert hours.loc[15] > 1.5 * hours.loc[10]


def test_an_experiment_adds_its_traffic_increase() -> None:
    start = datetime(2026, 3, 9, 17, tzinfo=UTC)  # 12 hours in
    experiment = Experiment(start=start, of_top=2, split=0.5, traffic_increase=0.5)
    scenario, catalog = _small(days=1, profile=((0.0, 1.0),), experiments=(experiment,))
    requests = generate(scenario, catalog, rng=np.random.default_rng(1)).requests
    after = requests["ts"] >= pd.Timestamp(start)
    assert 1.4 < after.sum() / (~after).sum() < 1.6
