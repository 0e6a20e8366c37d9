"""lorafleet convert servegen: a ServeGen client folder becomes a request log to replay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.inputs.files import write_atomically

runner = CliRunner()
WINDOWS = 144  # one day of 600 s windows


def _client(folder: Path, number: int, rate: float, pattern: str, shape: float) -> None:
    rows = [
        f"{w * 600},{rate if rate else 0},{1.0 if rate else 0},{pattern if rate else ''},"
        f"{shape if rate else 0},{0.01 if rate else 0}"
        for w in range(WINDOWS)
    ]
    (folder / f"chunk-{number}-trace.csv").write_text("\n".join(rows) + "\n")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Three clients with demand, steady (Gamma 4) and bursty (Weibull 0.4), and one idle."""
    root = tmp_path / "m-tiny"
    root.mkdir()
    _client(root, 0, 0.5, "Gamma", 4.0)
    _client(root, 7, 0.2, "Weibull", 0.4)
    _client(root, 12, 0.0, "", 0.0)
    _client(root, 3, 0.05, "Gamma", 1.0)
    return root


def _convert(folder: Path, out: Path, *extra: str) -> pd.DataFrame:
    result = runner.invoke(
        app,
        ["convert", "servegen", str(folder), "-o", str(out), "--scale", "1", *extra],
    )
    assert result.exit_code == 0, result.output
    return pd.read_parquet(out)


def test_one_adapter_per_client_with_its_rate(folder: Path, tmp_path: Path) -> None:
    log = _convert(folder, tmp_path / "log.parquet", "--start", "2026-03-09T00:00:00-04:00")
    counts = log["adapter"].value_counts()
    assert set(counts.index) == {"client-000", "client-003", "client-007"}
    for name, rate in (("client-000", 0.5), ("client-007", 0.2), ("client-003", 0.05)):
        expected = rate * 600 * WINDOWS
        assert abs(counts[name] - expected) < 5 * np.sqrt(expected), name
    start = pd.Timestamp("2026-03-09T04:00:00Z")
    assert log["ts"].is_monotonic_increasing
    assert log["ts"].min() >= start
    assert log["ts"].max() < start + pd.Timedelta(days=1)
    assert (log["tenant"].astype(str) == log["adapter"].astype(str)).all()


def test_burstiness_follows_the_inter_arrival_distribution(folder: Path, tmp_path: Path) -> None:
    log = _convert(folder, tmp_path / "log.parquet")

    def gap_cv(name: str) -> float:
        seconds = (log.loc[log["adapter"] == name, "ts"].astype("int64") / 1e9).to_numpy()
        gaps = np.diff(seconds)
        return float(gaps.std() / gaps.mean())

    assert gap_cv("client-000") < 0.8  # Gamma of shape 4: CV 0.5
    assert gap_cv("client-007") > 1.5  # Weibull of shape 0.4: CV about 2.6


def test_rps_rescales_the_whole_log(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "log.parquet"
    result = runner.invoke(
        app, ["convert", "servegen", str(folder), "-o", str(out), "--rps", "2", "--days", "0.5"]
    )
    assert result.exit_code == 0, result.output
    log = pd.read_parquet(out)
    assert abs(len(log) / 43_200 - 2.0) < 0.1


def test_same_seed_writes_the_same_log(folder: Path, tmp_path: Path) -> None:
    a = _convert(folder, tmp_path / "a.parquet", "--seed", "4")
    _convert(folder, tmp_path / "b.parquet", "--seed", "4")
    _convert(folder, tmp_path / "c.parquet", "--seed", "5")
    assert len(a) > 0
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "c.parquet").read_bytes()


def test_the_stubs_validate_and_replay(folder: Path, tmp_path: Path) -> None:
    log, catalog, fleet = tmp_path / "log.parquet", tmp_path / "c.yaml", tmp_path / "f.yaml"
    _convert(
        folder, log, "--days", "0.25", "--catalog-out", str(catalog), "--fleet-out", str(fleet)
    )
    files = ["--catalog", str(catalog), "--fleet", str(fleet), "--log", str(log)]
    checked = runner.invoke(app, ["validate", *files])
    assert checked.exit_code == 0, checked.output
    replayed = runner.invoke(app, ["replay", *files, "--policy", "epp", "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert '"epp"' in replayed.stdout


def test_the_outputs_may_name_a_new_folder(folder: Path, tmp_path: Path) -> None:
    new = tmp_path / "converted" / "m-tiny"
    catalog, fleet = new / "catalog.yaml", new / "fleet.yaml"
    frame = _convert(
        folder, new / "requests.parquet", "--catalog-out", str(catalog), "--fleet-out", str(fleet)
    )
    assert len(frame) > 0
    assert catalog.is_file() and fleet.is_file()


def test_writing_into_a_missing_folder_names_it(tmp_path: Path) -> None:
    target = tmp_path / "absent" / "plan.json"
    with pytest.raises(FileNotFoundError, match=r"absent/plan\.json: .*absent does not exist"):
        write_atomically(target, "{}")
    assert not (tmp_path / "absent").exists()
    (tmp_path / "taken").write_text("")
    with pytest.raises(FileNotFoundError, match=r"taken is not a directory"):
        write_atomically(tmp_path / "taken" / "plan.json", "{}")


def test_a_bad_trace_leaves_no_new_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "new" / "requests.parquet"
    result = runner.invoke(app, ["convert", "servegen", str(empty), "-o", str(out)])
    assert result.exit_code == 2
    assert not out.parent.exists()


def test_a_command_that_cannot_write_says_where(folder: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("a file where the output folder should be\n")
    result = runner.invoke(
        app, ["convert", "servegen", str(folder), "-o", str(blocker / "requests.parquet")]
    )
    assert result.exit_code == 2, result.output
    assert "taken" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(lambda root: None, "no ServeGen client files", id="empty-folder"),
        pytest.param(
            lambda root: (root / "chunk-1-trace.csv").write_text("0,fast,1,Gamma,1,1\n"),
            "line 1: not a ServeGen client trace: not numbers or a rate below 0",
            id="not-a-number",
        ),
        pytest.param(
            lambda root: (root / "chunk-1-trace.csv").write_text("0,0,0,,0,0\n"),
            "no client has any demand",
            id="all-idle",
        ),
    ],
)
def test_a_bad_folder_is_one_line(
    tmp_path: Path, make: Callable[[Path], object], expected: str
) -> None:
    root = tmp_path / "bad"
    root.mkdir()
    make(root)
    result = runner.invoke(
        app, ["convert", "servegen", str(root), "-o", str(tmp_path / "o.parquet")]
    )
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "entry"),
    [
        pytest.param("0,1,1,Gamma,1,1\n\n600,fast,1,Gamma,1,1\n", "line 3", id="blank-line"),
        pytest.param("\n \t\n0,-1,1,Gamma,1,1\n", "line 3", id="blank-lines-first"),
        pytest.param(
            "0,x,1,Gamma,1,1\r\n\r\n600,1,1,Gamma,1,1\r\n\r\n1200,y,1,Gamma,1,1\r\n",
            "lines 1, 5",
            id="crlf",
        ),
    ],
)
def test_a_bad_window_is_named_by_its_line_in_the_file(
    tmp_path: Path, text: str, entry: str
) -> None:
    """Blank lines count, as an editor counts them (pandas skips them as windows)."""
    root = tmp_path / "bad"
    root.mkdir()
    (root / "chunk-1-trace.csv").write_text(text, newline="")
    result = runner.invoke(
        app, ["convert", "servegen", str(root), "-o", str(tmp_path / "o.parquet")]
    )
    assert result.exit_code == 2
    assert f"chunk-1-trace.csv: {entry}: not a ServeGen client trace" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("windows", "expected"),
    [
        pytest.param(
            "0,1,1,Gamma,1,1\n600,1,1,Exponential,1,1\n1200,1,1,gamma,1,1\n",
            "client client-007: lines 2, 3: pattern: not a ServeGen distribution (accepted:"
            " Gamma, Weibull, or empty in an idle window), got 'Exponential', 'gamma'",
            id="unknown-pattern",
        ),
        pytest.param(
            "0,1,1,Weibull,-0.5,1\n",
            "client client-007: line 1: shape: expected a finite number above 0 for a Gamma or"
            " Weibull window (0 in an idle one), got -0.5",
            id="negative-shape",
        ),
        pytest.param(
            "0,1,1,Gamma,0,1\n600,0,0,,-1,0\n",
            "client client-007: lines 1, 2: shape: expected a finite number above 0 for a Gamma"
            " or Weibull window (0 in an idle one), got 0, -1",
            id="zero-shape-and-negative-when-idle",
        ),
        pytest.param(
            "0,1,1,Gamma,inf,1\n",
            "client client-007: line 1: shape: expected a finite number above 0",
            id="infinite-shape",
        ),
    ],
)
def test_a_window_no_distribution_draws_is_named_by_client_line_and_field(
    tmp_path: Path, windows: str, expected: str
) -> None:
    # An unknown pattern was drawn as exponential gaps, a shape <= 0 as a shape of 1
    # (_gaps' fallback), and the log written without a word.
    root = tmp_path / "bad"
    root.mkdir()
    trace = root / "chunk-7-trace.csv"
    trace.write_text(windows)
    out = tmp_path / "o.parquet"
    result = runner.invoke(app, ["convert", "servegen", str(root), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert f"error: {trace}: {expected}" in result.output.replace("\n", "")
    assert not out.exists()
