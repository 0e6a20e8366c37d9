"""The alert rules and dashboard: promtool checks them, unit tests fire and hold each
alert, and every metric they name is one lorafleet exports and documents."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from placement.controller.live_ports import PrometheusObserver
from placement.controller.webhook import WebhookMetrics
from placement.router.metrics import RouterMetrics
from placement.router.warmups import WarmupMetrics
from placement.settings import ForecastSettings, PlannerSettings

from .conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "rules.yaml"
OPERATOR_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMTOOL_TESTS = Path(__file__).parent / "promtool" / "rules_test.yaml"
DOC = REPO / "docs" / "metrics.md"
NAME = re.compile(r"\blorafleet(?::[a-z0-9_]+)+|\blorafleet_[a-z0-9_]+")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def run(args: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def every_family() -> CollectorRegistry:
    """One registry with every lorafleet metric family: router, controller (its observer
    builds ControllerMetrics and FleetMetrics) and webhook. A name defined twice raises."""
    registry = CollectorRegistry()
    RouterMetrics(registry)
    WarmupMetrics(registry)
    # The controller's, with the fleet families inside.
    PrometheusObserver(registry, bucket_s=ForecastSettings().bucket_s)
    WebhookMetrics(registry)
    return registry


def exported_samples() -> set[str]:
    """Every sample name lorafleet exports (counters as _total, histograms as
    _bucket/_sum/_count)."""
    registry = every_family()
    names = set()
    for family in registry.collect():
        names.add(family.name)
        suffixes = {
            "counter": ["_total"],
            "histogram": ["_bucket", "_sum", "_count"],
        }.get(family.type, [""])
        names.update(family.name + suffix for suffix in suffixes)
    return names


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in board["panels"] for target in panel["targets"]]


def test_promtool_checks_the_plain_rules(promtool: str) -> None:
    result = run([promtool, "check", "rules", str(RULES)], cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_operator_rule_carries_the_same_groups(promtool: str, tmp_path: Path) -> None:
    resource = load_yaml(OPERATOR_RULE)
    assert resource["kind"] == "PrometheusRule"
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["spec"]["groups"] == load_yaml(RULES)["groups"]
    extracted = tmp_path / "operator.yaml"
    extracted.write_text(yaml.safe_dump({"groups": resource["spec"]["groups"]}))
    result = run([promtool, "check", "rules", str(extracted)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fire_and_hold_every_alert(promtool: str) -> None:
    result = run([promtool, "test", "rules", PROMTOOL_TESTS.name], cwd=PROMTOOL_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_unit_test() -> None:
    tested = load_yaml(PROMTOOL_TESTS)["tests"]
    fired = {
        case["alertname"]
        for test in tested
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    # promtool compares the exact list of firing alerts, so the series in each case
    # that stay under their threshold (other pods, pools) are checked not to fire.
    assert alerts == fired


@pytest.mark.parametrize(
    ("alert", "threshold"),
    [
        ("LorafleetAdapterResidencyLow", "< 300"),
        ("LorafleetAdapterThrashing", "< 30"),
        ("LorafleetPodLoadRateHigh", "> 0.5"),
        ("LorafleetActiveAdaptersNearSlots", "> 0.8"),
        ("LorafleetGpuHitRatioLow", "< 0.9"),
        ("LorafleetPlanStale", "> 3 * max(lorafleet_plan_period_seconds)"),
        ("LorafleetPodLoadRateCritical", "lorafleet:pod_loads:rate2m > 1"),
        ("LorafleetAdapterResidencyP95Low", "lorafleet:adapter_residency_seconds:p95 < 300"),
        ("LorafleetTenantGpuResidencyPromiseBroken", "< 0.97"),
        ("LorafleetForecastWorseThanNaive", "lorafleet:forecast_mae_vs_naive:ratio1d > 1"),
    ],
)
def test_alert_thresholds(alert: str, threshold: str) -> None:
    (rule,) = [rule for rule in rules() if rule.get("alert") == alert]
    assert threshold in " ".join(rule["expr"].split())


def test_the_promise_alert_holds_the_settings_target() -> None:
    """The rule file cannot read settings: its literal must be the default promise."""
    target = getattr(PlannerSettings(), "gpu_residency_target", None)
    if target is None:
        pytest.skip("PlannerSettings has no gpu_residency_target yet")
    (rule,) = [r for r in rules() if r.get("alert") == "LorafleetTenantGpuResidencyPromiseBroken"]
    assert rule["expr"].split("<")[-1].strip() == repr(target)


def test_rules_and_dashboard_name_only_exported_or_recorded_series() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    known = exported_samples() | recorded
    texts = [rule["expr"] for rule in rules()] + dashboard_exprs()
    named = {name for text in texts for name in NAME.findall(text)}
    assert named, "the regular expression found no metric names"
    assert named <= known, f"unknown series: {sorted(named - known)}"


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    group = {
        "name": "dashboard",
        "rules": [{"record": f"dashboard:panel_{i}", "expr": e} for i, e in enumerate(exprs)],
    }
    checked = tmp_path / "dashboard_rules.yaml"
    checked.write_text(yaml.safe_dump({"groups": [group]}))
    result = run([promtool, "check", "rules", str(checked)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_covers_every_alerted_signal() -> None:
    shown = " ".join(dashboard_exprs())
    for rule in rules():
        if "record" in rule:
            assert rule["record"] in shown, f"{rule['record']} is not on the dashboard"
    for family in (
        "lorafleet_load_queue_depth",
        "lorafleet_controller_actions_total",
        "lorafleet_forecast_error_ratio",
        "lorafleet_solver_gap_ratio",
        "lorafleet_adapter_load_seconds_bucket",
        "lorafleet_request_queue_seconds_bucket",
        "lorafleet_forecast_mae_rps",
    ):
        assert family in shown


def test_docs_list_every_family_and_alert() -> None:
    text = DOC.read_text()
    for family in every_family().collect():
        documented = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{documented}`" in text, f"{documented} is not in docs/metrics.md"
    for rule in rules():
        assert f"`{rule.get('alert') or rule['record']}`" in text


def test_kustomization_names_existing_files() -> None:
    kustomization = load_yaml(MONITORING / "kustomization.yaml")
    for resource in kustomization["resources"]:
        assert (MONITORING / resource).is_file()
    for generator in kustomization["configMapGenerator"]:
        for entry in generator["files"]:
            assert (MONITORING / entry.split("=")[-1]).is_file()


@pytest.mark.parametrize(("ci", "outcome"), [("true", "fail"), ("", "skip")], ids=["ci", "local"])
def test_a_missing_tool_fails_under_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: str
) -> None:
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected, match=r"not installed .*ensure-prometheus"):
        require_tool("lorafleet-no-such-tool")


def _deployment(name: str) -> dict[str, Any]:
    loaded = load_yaml(REPO / "deploy" / "base" / f"{name}-deployment.yaml")
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize("component", ["controller", "router"])
def test_pod_monitor_selects_the_pods_and_their_metrics_port(component: str) -> None:
    monitor = load_yaml(MONITORING / "podmonitor.yaml")
    template = _deployment(component)["spec"]["template"]
    labels = template["metadata"]["labels"]
    selector = monitor["spec"]["selector"]
    assert all(labels.get(k) == v for k, v in selector["matchLabels"].items())
    for expression in selector["matchExpressions"]:
        assert expression["operator"] == "In"
        assert labels.get(expression["key"]) in expression["values"]
    ports = {
        port["name"]
        for container in template["spec"]["containers"]
        for port in container.get("ports", [])
    }
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
