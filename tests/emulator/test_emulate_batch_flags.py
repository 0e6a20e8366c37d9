"""``lorafleet emulate``'s batch flags: none given, requests run at once at the fixed
times; any given, the pods are the replay's pod, every parameter not given taken from
the settings tree (``SimSettings``), never from a second copy. The demo fills every flag
from ``SimSettings``; one slow test starts the pods as the demo does and reads the
batch model back from them."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.cli.emulate_cmds import batch_timing
from placement.demo.processes import local_processes
from placement.demo.setup import PodTimings
from placement.emulator.config import BatchTiming
from placement.settings import Settings, SimSettings

runner = CliRunner()


def test_no_batch_flag_no_batch_model() -> None:
    assert batch_timing(None, None, None, None, None) is None


def test_a_flag_given_takes_the_rest_from_the_settings() -> None:
    sim = SimSettings()
    assert batch_timing(8, None, None, None, None) == BatchTiming(
        max_num_seqs=8,
        prefill_ms_per_token=sim.prefill_ms_per_token,
        decode_ms_per_step=sim.decode_ms_per_step,
        batch_step_slowdown=sim.batch_step_slowdown,
        adapter_step_cost=sim.adapter_step_cost,
    )
    assert batch_timing(None, None, 12.0, None, None) == BatchTiming(
        max_num_seqs=sim.max_num_seqs,
        prefill_ms_per_token=sim.prefill_ms_per_token,
        decode_ms_per_step=12.0,
        batch_step_slowdown=sim.batch_step_slowdown,
        adapter_step_cost=sim.adapter_step_cost,
    )


def test_the_demos_pods_run_the_replays_model() -> None:
    settings = Settings()
    timings = PodTimings.replayed(settings)
    assert timings.batch == BatchTiming.of(settings.sim)
    assert (timings.ttft_ms, timings.tpot_ms) == (0.0, 0.0)
    flags = timings.emulate_flags()
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    assert given["--max-num-seqs"] == str(settings.sim.max_num_seqs)
    assert given["--decode-ms-per-step"] == str(settings.sim.decode_ms_per_step)
    assert given["--kv-capacity-tokens"] == str(settings.sim.kv_capacity_tokens)


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        pytest.param(["--max-num-seqs", "0"], "--max-num-seqs", id="no-place"),
        pytest.param(["--decode-ms-per-step", "-1"], "--decode-ms-per-step", id="negative"),
    ],
)
def test_a_bad_batch_flag_is_one_line(flags: list[str], line: str) -> None:
    result = runner.invoke(app, ["emulate", "--pods", "1", *flags], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert line in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_pods_started_as_the_demo_starts_them_report_the_replays_batch(
    tmp_path: Path,
) -> None:
    settings = Settings()
    with local_processes(tmp_path) as processes:
        ports_file = tmp_path / "pods.json"
        args = ["emulate", "--pods", "1", "--port", "0", "--ports-file", str(ports_file)]
        child = processes.start("pods", [*args, *PodTimings.replayed(settings).emulate_flags()])
        urls = json.loads(processes.wait_for_file(child, ports_file, timeout_s=60))
        for url in urls.values():
            stats = httpx.get(f"{url}/admin/stats", timeout=5).json()
            assert stats["batch"] == asdict(BatchTiming.of(settings.sim))
