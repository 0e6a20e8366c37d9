"""Faults in a replay: the spec read, a seeded schedule, and what each fault does."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import placement.cli  # noqa: F401  (registers the commands)
from placement.cli.app import app
from placement.domain import Catalog, Fleet
from placement.errors import InputError
from placement.settings import Settings
from placement.sim.faults import (
    DOWN,
    RESTART,
    UP,
    FaultSchedule,
    FaultStep,
    parse_inline,
    parse_yaml,
    schedule,
)
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from tests import factories
from tests.fleets import fleet_yaml

MB = 1_000_000
GiB = 1 << 30
START = datetime(2026, 3, 10, 9, tzinfo=UTC)
MODEL = "llama-3.1-8b"
PODS = ("pod-0", "pod-1")


def workload(arrivals: list[tuple[float, str]]) -> SimWorkload:
    return SimWorkload(
        start=START,
        arrival_s=[at for at, _ in arrivals],
        adapters=[name for _, name in arrivals],
        prompt_tokens=[100] * len(arrivals),
        output_tokens=[10] * len(arrivals),
        size_bytes=dict.fromkeys({name for _, name in arrivals}, 50 * MB),
    )


def fleet_of(count: int) -> Fleet:
    return factories.replay_fleet(count)


def catalog_of(load: SimWorkload) -> Catalog:
    return factories.replay_catalog(load.size_bytes)


ONE_ADAPTER = workload([(float(t), "a") for t in range(0, 120, 2)])


def replayed(
    name: str, load: SimWorkload, faults: FaultSchedule | None, pods: int = 1
) -> ReplayResult:
    settings = Settings()
    fleet = fleet_of(pods)
    planning = replay_planning(catalog_of(load), fleet, settings=settings, planner="greedy")
    return run_policy(name, load, fleet, settings=settings, planning=planning, faults=faults)


class TestSpec:
    def test_inline_items_become_steps_in_time_order(self) -> None:
        spec = parse_inline("outage=pod-1@1h+15,restart=pod-0@30m,slow=3x@2h+20@pod-0")
        faults = schedule(spec, PODS, 10_000.0)
        assert faults.steps == (
            FaultStep(at_s=1800.0, kind=RESTART, pod_id="pod-0"),
            FaultStep(at_s=3600.0, kind=DOWN, pod_id="pod-1"),
            FaultStep(at_s=4500.0, kind=UP, pod_id="pod-1"),
        )
        assert faults.load_factor("pod-0", 7300.0) == 3.0
        assert faults.load_factor("pod-1", 7300.0) == 1.0
        assert faults.load_factor("pod-0", 7200.0 + 1200.0) == 1.0

    def test_yaml_has_the_inline_keys(self) -> None:
        raw = {"restart": ["pod-0@90s", "pod-1@2m"], "seed": 3, "outages": 1}
        inline = "restart=pod-0@90s,restart=pod-1@2m,seed=3,outages=1"
        assert schedule(parse_yaml(raw, source="f.yaml"), PODS, 600.0) == schedule(
            parse_inline(inline), PODS, 600.0
        )

    def test_a_seed_gives_one_schedule_and_another_seed_another(self) -> None:
        spec = "seed={},restarts=3,outages=2,slowdowns=2"
        first = schedule(parse_inline(spec.format(7)), PODS, 3600.0)
        assert first == schedule(parse_inline(spec.format(7)), PODS, 3600.0)
        assert first != schedule(parse_inline(spec.format(8)), PODS, 3600.0)
        assert len(first.steps) == 3 + 2 * 2
        assert len(first.slowdowns) == 2

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            ("restart=pod-0@soon", "not an offset"),
            ("explode=pod-0", "unknown key 'explode'"),
            ("restart", "expected key=value"),
            ("outage=pod-0@1m+-5", "at least 0"),
            ("restart=pod-9@1m", "no pod 'pod-9'"),
        ],
        ids=["bad-offset", "unknown-key", "no-value", "negative", "unknown-pod"],
    )
    def test_bad_specs_name_the_item(self, spec: str, message: str) -> None:
        with pytest.raises(InputError) as caught:
            schedule(parse_inline(spec), PODS, 600.0)
        assert message in str(caught.value.problems[0])


class TestEffects:
    def test_a_restart_empties_the_pod(self) -> None:
        calm = replayed("epp", ONE_ADAPTER, None)
        restarted = replayed(
            "epp", ONE_ADAPTER, schedule(parse_inline("restart=pod-0@61s"), ("pod-0",), 120.0)
        )
        assert calm.metrics["loads"] == 1
        assert restarted.metrics["loads"] == 2
        assert restarted.metrics["cold_loads"] == 2

    def test_no_request_reaches_a_pod_while_it_is_gone(self) -> None:
        load = workload([(float(t), f"a{t % 3}") for t in range(0, 120)])
        faults = schedule(parse_inline("outage=pod-0@30s+1"), PODS, 120.0)
        result = replayed("bounded", load, faults, pods=2)
        during = [
            pod
            for at_s, pod in zip(load.arrival_s, result.log.pod, strict=True)
            if 30.0 <= at_s < 90.0
        ]
        assert during and set(during) == {1}
        after = {
            pod for at_s, pod in zip(load.arrival_s, result.log.pod, strict=True) if at_s >= 90
        }
        assert result.metrics["served"] == len(load)
        assert after  # the pod came back (empty): traffic resumes

    def test_a_slowdown_stretches_the_loads_in_its_window(self) -> None:
        calm = replayed("epp", ONE_ADAPTER, None)
        slow = replayed(
            "epp", ONE_ADAPTER, schedule(parse_inline("slow=4@0s+1"), ("pod-0",), 120.0)
        )
        ((start, end, _, _),) = calm.log.loads
        ((slow_start, slow_end, _, _),) = slow.log.loads
        assert slow_end - slow_start == pytest.approx(4 * (end - start))

    @pytest.mark.parametrize("name", ["epp", "bounded", "lorafleet"])
    def test_a_seeded_schedule_replays_the_same_twice(self, name: str) -> None:
        load = workload([(float(t), f"a{t % 5}") for t in range(0, 300)])
        faults = schedule(
            parse_inline("seed=11,restarts=2,outages=1,outage_minutes=1"), PODS, 300.0
        )
        assert (
            replayed(name, load, faults, pods=2).metrics
            == replayed(name, load, faults, pods=2).metrics
        )


def test_cli_takes_an_inline_spec_and_a_yaml_file(tmp_path: Path) -> None:
    names = [f"t-{i}" for i in range(3)]
    (tmp_path / "catalog.yaml").write_text(
        "adapters:\n"
        + "".join(
            f"  - {{name: {n}, base_model: {MODEL}, rank: 16, target_modules: [q_proj],"
            f" source: s3://a/{n}}}\n"
            for n in names
        )
    )
    (tmp_path / "fleet.yaml").write_text(fleet_yaml())
    start = pd.Timestamp("2026-03-10T09:00:00Z")
    pd.DataFrame(
        [{"ts": start + pd.Timedelta(seconds=i), "adapter": names[i % 3]} for i in range(300)]
    ).to_parquet(tmp_path / "requests.parquet", index=False)
    (tmp_path / "faults.yaml").write_text("restart: [pod-0@1m]\noutage: [pod-1@2m+1]\n")
    base = ["replay", "--catalog", str(tmp_path / "catalog.yaml"), "--fleet"]
    base += [str(tmp_path / "fleet.yaml"), "--log", str(tmp_path / "requests.parquet")]
    base += ["--policy", "epp", "--json", "--faults"]
    inline = CliRunner().invoke(app, [*base, "restart=pod-0@1m,outage=pod-1@2m+1"])
    from_file = CliRunner().invoke(app, [*base, str(tmp_path / "faults.yaml")])
    assert inline.exit_code == 0, inline.output
    assert json.loads(inline.stdout) == json.loads(from_file.stdout)
    # The requests after the two pod losses (one restart at 1 min, one outage at 2 min):
    # all 300 arrive within 10 minutes of the first, 180 of them after the second.
    lost = json.loads(inline.stdout)["policies"]["epp"]["after_pod_loss"]
    assert lost["pod_losses"] == 2
    assert lost["requests"] == 300 - 60
    assert 0.0 < lost["served_share"] <= 1.0
    text = CliRunner().invoke(app, [*base[:-2], "--faults", "restart=pod-0@1m"])
    assert text.exit_code == 0, text.output
    assert "after each of 1 pod losses, 240 requests" in text.output
    bad = CliRunner().invoke(app, [*base, "restart=pod-7@1m"])
    assert bad.exit_code == 2
    assert "no pod 'pod-7'" in bad.output
    assert "Traceback" not in bad.output
