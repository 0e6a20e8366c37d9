"""Every command that takes a request log the user names (plan, replay, capacity,
recommend pins, review) reads the router's as forecast and backtest do
(``placement.cli.request_logs.read_log``): its JSON-lines file with the rotation beside
it, or its --request-log directory, as one log; a log written by hand strictly, a bad
row an error."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import placement.cli  # noqa: F401  (registers the commands)
from placement.adapters.request_log_files import ParquetRequestLog
from placement.cli.app import app
from placement.plan import plan_to_json
from tests.cli.router_logs import router_rows, write_rotated, write_whole
from tests.factories import make_plan
from tests.fleets import fleet_yaml

runner = CliRunner()
START = pd.Timestamp("2026-03-10T08:00:00Z")
ADAPTERS = ("alpha", "beta", "gamma", "delta")
#: Four hours, a request every 4 s; the active file holds the last 10 minutes.
REQUESTS, ACTIVE = 3600, 150


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog, a fleet, a plan, and the same router rows three ways: in one JSON-lines
    file (whole/), in the router's file with one rotation (router/), and in its
    --request-log directory (directory/). Alpha is four requests in six and delta none
    until the last 10 minutes, when the four take turns: a log that loses the rotation
    has other rates, shares and counts."""
    root = tmp_path_factory.mktemp("world")
    (root / "fleet.yaml").write_text(fleet_yaml(max_lora_rank=16))
    (root / "catalog.yaml").write_text(
        "adapters:\n"
        + "".join(
            f"  - {{name: {name}, base_model: llama-3.1-8b, rank: 8, tenant: acme,"
            f" target_modules: [q_proj, v_proj], source: /adapters/{name}}}\n"
            for name in ADAPTERS
        )
    )
    (root / "plan.json").write_text(
        plan_to_json(make_plan({"pod-0": ["alpha", "beta"], "pod-1": ["alpha", "gamma"]}))
    )
    early = ("alpha", "alpha", "alpha", "beta", "alpha", "gamma")
    cut = REQUESTS - ACTIVE
    frame = pd.DataFrame(
        {
            "ts": START + pd.to_timedelta(np.arange(REQUESTS) * 4, unit="s"),
            "adapter": [early[i % 6] if i < cut else ADAPTERS[i % 4] for i in range(REQUESTS)],
            "tenant": "acme",
        }
    )
    frame.to_parquet(root / "requests.parquet", index=False)
    rows = router_rows(root / "requests.parquet")
    write_whole(rows, root / "whole" / "requests.jsonl")
    write_rotated(rows, root / "router" / "requests.jsonl", cut=cut)
    sink = ParquetRequestLog(root / "directory")
    for start in range(0, len(rows), 600):  # flushes: earlier hours compacted, not the last
        sink.write(rows[start : start + 600])
    return root


def _inputs(world: Path) -> list[str]:
    return ["--catalog", str(world / "catalog.yaml"), "--fleet", str(world / "fleet.yaml")]


def _invoke(argv: list[str]) -> str:
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    return result.stdout


def _plan(world: Path, log: Path, scratch: Path) -> object:
    """The plan's forecast rates per adapter (the solver's choices aside), at 11:00: a
    log this short is forecast naively, from its last buckets, so the plan's time is
    one whose history lies in the rotation."""
    target = scratch / "plan.json"
    argv = ["plan", *_inputs(world), "--at", "2026-03-10T11:00:00Z", "--time-limit", "2"]
    _invoke([*argv, "--log", str(log), "-o", str(target)])
    adapters = json.loads(target.read_text())["adapters"]
    return {name: (entry.get("mean_rps"), entry.get("q90_rps")) for name, entry in adapters.items()}


def _replay(world: Path, log: Path, scratch: Path) -> object:
    argv = ["replay", *_inputs(world), "--log", str(log), "--policy", "hash", "--json"]
    return json.loads(_invoke(argv))["policies"]


def _capacity(world: Path, log: Path, scratch: Path) -> object:
    argv = ["capacity", *_inputs(world), "--log", str(log), "--target-hit", "0.5"]
    argv += ["--policy", "bounded", "--slots", "1", "--pods", "2", "--jobs", "1", "--json"]
    return json.loads(_invoke(argv))["grid"]


def _recommend(world: Path, log: Path, scratch: Path) -> object:
    return json.loads(_invoke(["recommend", "pins", *_inputs(world), "--log", str(log), "--json"]))


def _review(world: Path, log: Path, scratch: Path) -> object:
    """The requests the HTML report's replay counts (the log's last day: all of it)."""
    page = scratch / "review.html"
    argv = ["review", str(world / "plan.json"), *_inputs(world), "--html", str(page)]
    _invoke([*argv, "--log", str(log)])
    counted = re.search(r"Replay of (\d+) requests", page.read_text())
    assert counted is not None
    return int(counted.group(1))


Outcome = Callable[[Path, Path, Path], object]
COMMANDS = [
    pytest.param(_plan, id="plan"),
    pytest.param(_replay, id="replay"),
    pytest.param(_capacity, id="capacity"),
    pytest.param(_recommend, id="recommend-pins"),
    pytest.param(_review, id="review"),
]


@pytest.mark.parametrize("outcome", COMMANDS)
@pytest.mark.parametrize("layout", ["router", "directory"])
def test_the_routers_log_gives_what_the_whole_log_in_one_file_gives(
    world: Path, tmp_path: Path, outcome: Outcome, layout: str
) -> None:
    """`lorafleet router --request-log requests.jsonl` renames the file past
    log_rotate_bytes and begins a new one: "--log requests.jsonl" read the new one
    alone, strictly (the rotation's requests lost); "--log DIR" was "unknown format"."""
    log = world / layout if layout == "directory" else world / layout / "requests.jsonl"
    whole = outcome(world, world / "whole" / "requests.jsonl", tmp_path)
    assert outcome(world, log, tmp_path) == whole


BAD_ROWS = {
    "requests.jsonl": '{"ts": "2026-03-10T08:00:00Z", "adapter": "alpha"}\n'
    '{"ts": "2026-03-10T08:01:00Z"}\n',
    "requests.csv": "ts,adapter\n2026-03-10T08:00:00Z,alpha\n2026-03-10T08:01:00Z,\n",
}


def _argv(command: str, world: Path, scratch: Path) -> list[str]:
    """The command's arguments but --log, each valid."""
    if command == "review":
        return ["review", str(world / "plan.json")]
    own = {
        "plan": ["plan", "--at", "2026-03-10T12:00:00Z", "-o", str(scratch / "plan.json")],
        "replay": ["replay", "--policy", "hash"],
        "capacity": ["capacity", "--target-hit", "0.5", "--slots", "1", "--pods", "2"],
        "recommend-pins": ["recommend", "pins"],
    }
    return [*own[command], *_inputs(world)]


@pytest.mark.parametrize("command", ["plan", "replay", "capacity", "recommend-pins", "review"])
@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_a_log_written_by_hand_is_read_strictly(
    world: Path, tmp_path: Path, command: str, name: str
) -> None:
    """Not the router's fields: a row without an adapter is an error (exit 2) naming the
    file, not a warning and the row left out."""
    log = tmp_path / name
    log.write_text(BAD_ROWS[name])
    result = runner.invoke(app, [*_argv(command, world, tmp_path), "--log", str(log)])
    assert result.exit_code == 2, result.output
    assert f"{log}: line " in result.output and "rows without an adapter" in result.output
    assert "warning" not in result.output
