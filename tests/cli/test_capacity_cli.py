"""``lorafleet capacity`` at the command line: what it says when no shape meets the
target, when the GPU or the base model is unknown, and with events delivered."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import placement.cli  # noqa: F401  (registers the commands)
from placement.cli.app import app

runner = CliRunner()
DATA = Path(__file__).resolve().parents[2] / "data" / "legal-research"
BASE = ["capacity", "--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml"),
        "--log", str(DATA / "requests.parquet")]  # fmt: skip
#: Tuesday 9-10 ET, an hour of warm-up, one small shape, the cheap policy.
SMALL = ["--from", "2026-03-10T09:00:00-05:00", "--to", "2026-03-10T10:00:00-05:00",
         "--history", "1D", "--warmup", "1h", "--slots", "1", "--pods", "2",
         "--jobs", "1"]  # fmt: skip


def test_a_target_no_shape_meets_gets_the_best_shape_found_not_an_error() -> None:
    result = runner.invoke(app, [*BASE, *SMALL, "--policy", "bounded", "--target-hit", "1.0"])
    assert result.exit_code == 0, result.output
    assert "best found (no shape met the targets)" in result.stdout
    assert "no shape in the grid meets GPU hits >= 100.0%" in result.stdout
    assert "2 pods x 1 GPU slots" in result.stdout


def test_an_unknown_gpu_names_the_known_ones_and_how_to_give_bytes() -> None:
    result = runner.invoke(app, [*BASE, "--target-hit", "0.9", "--gpu", "h900"])
    assert result.exit_code == 2
    assert "unknown GPU 'h900'" in result.stderr and "h100-80gb" in result.stderr
    assert "--gpu 80GiB" in result.stderr and "Traceback" not in result.output


CONFIG = {"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
          "num_hidden_layers": 80, "intermediate_size": 28672, "vocab_size": 128256}  # fmt: skip


def test_a_base_model_not_built_in_names_the_known_ones_and_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    fleet = tmp_path / "fleet.yaml"
    text = (DATA / "fleet.yaml").read_text().replace("llama-3.1-70b", "mystery-70b")
    fleet.write_text(
        text.replace(
            "  base_model: mystery-70b", "  base_model: mystery-70b\n  model_config: config.json"
        )
    )
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text((DATA / "catalog.yaml").read_text().replace("llama-3.1-70b", "mystery-70b"))
    args = ["capacity", "--catalog", str(catalog), "--fleet", str(fleet), "--target-hit", "0.9",
            "--log", str(DATA / "requests.parquet"), "--gpu", "h100-80gb"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "unknown base model 'mystery-70b'" in result.stderr
    assert "llama-3.1-70b" in result.stderr and "--config" in result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 8192}')
    result = runner.invoke(app, [*args, "--config", str(bad)])
    assert result.exit_code == 2 and "--config" in result.stderr
    assert "num_attention_heads" in result.stderr and "Traceback" not in result.output


def test_events_reach_lorafleets_controller_in_every_shape() -> None:
    result = runner.invoke(
        app,
        [*BASE, *SMALL, "--target-hit", "0.5", "--events", str(DATA / "events.parquet"),
         "--pipelines", str(DATA / "pipelines.yaml"), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["grid"]) == 1 and report["policy"] == "lorafleet"
    assert report["cpu_s"] > 0.0


def test_load_admission_reaches_every_shape() -> None:
    """--load-admission vllm sizes the fleet under vLLM's admission (no drain before a
    load); an unknown one is a one-line error before any replay."""
    figures = {}
    for admission in ("drain", "vllm"):
        result = runner.invoke(
            app,
            [*BASE, *SMALL, "--policy", "epp", "--target-hit", "0.5", "--json",
             "--load-admission", admission],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        (shape,) = json.loads(result.stdout)["grid"]
        figures[admission] = shape
    assert figures["vllm"] != figures["drain"]
    result = runner.invoke(app, [*BASE, *SMALL, "--target-hit", "0.5", "--load-admission", "fifo"])
    assert result.exit_code == 2
    assert "unknown admission 'fifo'" in result.output and "Traceback" not in result.output
