"""``lorafleet forecast`` and ``lorafleet backtest`` through the console script's app."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.adapters.request_log_files import ParquetRequestLog
from placement.cli.app import app
from tests.cli.router_logs import router_rows, write_rotated, write_whole

START = pd.Timestamp("2026-01-01T00:00:00Z")


def write_log(path: Path, *, days: int, seed: int = 2) -> Path:
    """Two adapters with a daily bump (13:00 UTC) and one sparse adapter, per request."""
    rng = np.random.default_rng(seed)
    buckets = pd.date_range(START, periods=days * 144, freq="10min")
    hours = (np.arange(len(buckets)) % 144) / 6
    frames = []
    for name, peak in (("legal-assistant-v2", 12.0), ("support-bot", 4.0), ("rare-one", 0.02)):
        counts = rng.poisson(0.3 + peak * np.exp(-0.5 * ((hours - 13) / 2.5) ** 2))
        ts = np.repeat(buckets, counts) + pd.to_timedelta(
            rng.uniform(0, 599, counts.sum()), unit="s"
        )
        frames.append(pd.DataFrame({"ts": ts, "adapter": name, "tenant": "acme"}))
    pd.concat(frames).sort_values("ts").to_parquet(path, index=False)
    return path


@pytest.fixture(scope="module")
def log_3d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_log(tmp_path_factory.mktemp("logs") / "requests.parquet", days=3)


def test_forecast_writes_the_format_and_a_summary(log_3d: Path, tmp_path: Path) -> None:
    target = tmp_path / "forecast.parquet"
    plot = tmp_path / "top.png"
    result = CliRunner().invoke(
        app,
        [
            "forecast",
            "--log",
            str(log_3d),
            "--at",
            "2026-01-03T12:00:00Z",
            "--horizon",
            "6h",
            "--model",
            "profile-7d",
            "-o",
            str(target),
            "--plot",
            str(plot),
        ],
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(target)
    assert list(frame.columns) == ["ts", "adapter", "mean", "q50", "q90", "q99", "p_nonzero"]
    assert len(frame) == 3 * 36
    assert frame["ts"].min() == pd.Timestamp("2026-01-03T12:00:00Z")
    assert np.isfinite(frame.drop(columns=["ts", "adapter"]).to_numpy()).all()
    assert "legal-assistant-v2" in result.output
    assert "preload schedule" in result.output
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_forecast_uses_only_history_before_at(log_3d: Path, tmp_path: Path) -> None:
    # The same origin from the full log and from the log cut at the origin: same forecast.
    at = pd.Timestamp("2026-01-02T12:00:00Z")
    full = pd.read_parquet(log_3d)
    full[full["ts"] < at].to_parquet(tmp_path / "cut.parquet", index=False)
    outputs = []
    for log in (log_3d, tmp_path / "cut.parquet"):
        target = tmp_path / f"{log.stem}-forecast.parquet"
        argv = ["forecast", "--log", str(log), "--at", at.isoformat(), "--horizon", "2h"]
        result = CliRunner().invoke(app, [*argv, "-o", str(target)])
        assert result.exit_code == 0, result.output
        outputs.append(pd.read_parquet(target))
    pd.testing.assert_frame_equal(outputs[0], outputs[1])


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--horizon", "soon"], 2, "not a positive duration"),
        (["--bucket", "0m"], 2, "not a positive duration"),
        (["--at", "yesterday"], 2, "not an ISO 8601 time"),
        (["--at", "2025-01-01T00:00:00Z"], 1, "no requests before"),
        (["--model", "crystal-ball"], 1, "unknown forecaster"),
    ],
    ids=["horizon", "bucket", "at", "before-the-log", "model"],
)
def test_forecast_bad_arguments_say_what(
    log_3d: Path, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    base = {"--at": "2026-01-03T00:00:00Z"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["forecast", "--log", str(log_3d), "-o", str(tmp_path / "f.parquet")]
    for flag, value in base.items():
        argv += [flag, value]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == code
    assert message in result.output
    assert "Traceback" not in result.output


def test_backtest_json_has_both_horizons(log_3d: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "backtest",
            "--log",
            str(log_3d),
            "--models",
            "persistence,seasonal-naive-day,profile-7d",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [h["horizon_s"] for h in report["horizons"]] == [3600, 86400]
    day = report["horizons"][1]
    assert {m["model"] for m in day["models"]} == {
        "persistence",
        "seasonal-naive-day",
        "profile-7d",
    }
    yesterday = next(m for m in day["models"] if m["model"] == "seasonal-naive-day")
    assert yesterday["major"]["mae_vs_yesterday"] == pytest.approx(1.0)
    assert "legal-assistant-v2" in day["major_adapters"]


def test_backtest_table(log_3d: Path) -> None:
    result = CliRunner().invoke(
        app, ["backtest", "--log", str(log_3d), "--models", "persistence,ewma"]
    )
    assert result.exit_code == 0, result.output
    assert "1 h ahead" in result.output and "24 h ahead" in result.output


def test_backtest_needs_two_days(tmp_path: Path) -> None:
    short = write_log(tmp_path / "short.parquet", days=1)
    result = CliRunner().invoke(app, ["backtest", "--log", str(short)])
    assert result.exit_code == 1
    assert "at least 2" in result.output


CATALOG = """
adapters:
- name: legal-assistant-v2
  base_model: llama-3.1-70b
  rank: 16
  target_modules: [q_proj, v_proj]
  source: s3://adapters/legal-assistant-v2
  tenant: acme
  timezone: America/Mexico_City
- name: support-bot
  base_model: llama-3.1-70b
  rank: 8
  target_modules: [q_proj, v_proj]
  source: s3://adapters/support-bot
- name: never-used
  base_model: llama-3.1-70b
  rank: 8
  target_modules: [q_proj, v_proj]
  source: s3://adapters/never-used
"""


def test_forecast_with_a_catalog_covers_every_adapter(log_3d: Path, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    target = tmp_path / "f.parquet"
    argv = ["forecast", "--log", str(log_3d), "--at", "2026-01-03T00:00:00Z", "--horizon", "1h"]
    result = CliRunner().invoke(
        app, [*argv, "--catalog", str(catalog), "--model", "profile-7d", "-o", str(target)]
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(target)
    assert set(frame["adapter"]) == {"legal-assistant-v2", "support-bot", "rare-one", "never-used"}
    assert (frame.loc[frame["adapter"] == "never-used", "mean"] == 0).all()


def test_forecast_reads_the_routers_request_log_directory(log_3d: Path, tmp_path: Path) -> None:
    # `lorafleet router --request-log DIR [--workers 2]` writes hourly Parquet files, the
    # parts of the hour being written and, per further worker, DIR/w1: "--log DIR" was
    # "DIR: unknown format: use .parquet, .csv or .jsonl".
    directory = tmp_path / "router-log"
    sinks = [ParquetRequestLog(directory), ParquetRequestLog(directory / "w1")]
    rows = router_rows(log_3d)
    for start in range(0, len(rows), 150):  # flushes: earlier hours compacted, not the last
        sinks[(start // 150) % 2].write(rows[start : start + 150])
    assert any(".part" in p.name for p in directory.iterdir())
    (directory / ".requests-20260103T23.part000099.parquet.x.tmp").write_bytes(b"PAR1")
    junk = directory / "requests-20260105T00.parquet"
    junk.write_bytes(b"not Parquet")  # named, left out, the rest read
    output = _same_forecast(log_3d, directory, tmp_path)
    assert f"warning: {junk}: cannot read: " in output


def _same_forecast(log: Path, other: Path, tmp_path: Path) -> str:
    """``forecast --log`` on both gives the same frame; the second run's output."""
    outputs, result = [], None
    for path in (log, other):
        target = tmp_path / f"{path.stem}-forecast.parquet"
        argv = ["forecast", "--log", str(path), "--at", "2026-01-03T12:00:00Z", "--horizon", "2h"]
        result = CliRunner().invoke(app, [*argv, "--model", "profile-7d", "-o", str(target)])
        assert result.exit_code == 0, result.output
        outputs.append(pd.read_parquet(target))
    pd.testing.assert_frame_equal(outputs[0], outputs[1])
    assert result is not None
    return result.output


@pytest.mark.parametrize("command", ["forecast", "backtest"])
def test_the_routers_json_lines_file_is_read_with_its_rotation(
    log_3d: Path, tmp_path: Path, command: str
) -> None:
    """`lorafleet router --request-log requests.jsonl` renames the file past
    log_rotate_bytes (requests.<time>.jsonl) and begins a new one: "--log
    requests.jsonl" read the new one alone, so the rotation's requests (here the first
    two days) were lost; the controller's live_log reads both."""
    rows = router_rows(log_3d)
    cut = next(i for i, row in enumerate(rows) if row.ts_s >= START.timestamp() + 2 * 86_400)
    active = write_rotated(rows, tmp_path / "router" / "requests.jsonl", cut=cut)
    frames, reports = [], []
    for log in (log_3d, active):
        target = tmp_path / f"{log.stem}-{command}.out"
        argv = (
            ["forecast", "--at", "2026-01-03T12:00:00Z", "--horizon", "2h", "-o", str(target)]
            if command == "forecast"
            else ["backtest", "--json"]
        )
        argv += ["--model" if command == "forecast" else "--models", "profile-7d"]
        result = CliRunner().invoke(app, [*argv, "--log", str(log)])
        assert result.exit_code == 0, result.output
        if command == "forecast":
            frames.append(pd.read_parquet(target))
        else:
            reports.append(result.output)
    if command == "forecast":
        pd.testing.assert_frame_equal(frames[0], frames[1])
    else:
        assert reports[0] == reports[1]


def test_the_routers_json_lines_file_being_written_is_read_as_the_controller_reads_it(
    log_3d: Path, tmp_path: Path
) -> None:
    """No rotation yet, the router's fields: its half-written last line (a flush under
    way) waits, as the live_log's reader lets it; read strictly, it was "not a JSON
    object" and exit 2."""
    active = write_whole(router_rows(log_3d), tmp_path / "requests.jsonl")
    with active.open("ab") as handle:
        handle.write(b'{"ts":"2026-01-03T23:59:59Z","adapter":"support-bo')
    _same_forecast(log_3d, active, tmp_path)


def test_a_json_lines_log_not_the_routers_is_read_strictly(tmp_path: Path) -> None:
    """A hand-written JSON-lines log (not the router's fields) is read as plan reads it:
    a bad row is an error (exit 2), not a warning and a row left out."""
    log = tmp_path / "requests.jsonl"
    log.write_text(
        '{"ts": "2026-01-01T00:00:00Z", "adapter": "a1"}\n{"ts": "2026-01-01T00:01:00Z"}\n'
    )
    argv = ["forecast", "--log", str(log), "--at", "2026-01-02T00:00:00Z", "-o"]
    result = CliRunner().invoke(app, [*argv, str(tmp_path / "f.parquet")])
    assert result.exit_code == 2, result.output
    assert "warning" not in result.output
