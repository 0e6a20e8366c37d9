"""The demo counts the controller's own actions in the window from its /metrics text, as
the controller's registry writes it: only those run to the end, by kind."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest

from placement.actuation.executor import ActionResult, ApplyReport, Status
from placement.demo.measure import actions_between, controller_actions
from placement.domain import Action, AdapterId, Load, PodId, Unload, Warmup
from placement.metrics import ControllerMetrics


def _report(*pairs: tuple[Action, Status]) -> ApplyReport:
    return ApplyReport(results=tuple(ActionResult(action=a, status=s) for a, s in pairs))


def test_the_actions_run_to_the_end_are_counted_by_kind_across_pods() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    a, b = AdapterId("a"), AdapterId("b")
    metrics.apply_reported(
        _report(
            (Load(pod=PodId("pod-0"), adapter=a, reason="hot in plan"), Status.DONE),
            (Load(pod=PodId("pod-1"), adapter=a, reason="hot in plan"), Status.DONE),
            (Load(pod=PodId("pod-1"), adapter=b, reason="hot in plan"), Status.FAILED),
            (Warmup(pod=PodId("pod-0"), adapter=a, reason="hot"), Status.DONE),
            (Unload(pod=PodId("pod-0"), adapter=b, reason="not in plan"), Status.UNCHANGED),
        )
    )
    assert controller_actions(generate_latest(registry).decode()) == Counter(
        {"load": 2, "warmup": 1}
    )


def test_the_window_is_the_difference_of_two_reads() -> None:
    before = Counter({"load": 40, "warmup": 12})
    after = Counter({"load": 52, "warmup": 12, "unload": 3})
    assert actions_between(before, after) == (("load", 12), ("unload", 3), ("warmup", 0))


def test_a_controller_that_ran_nothing_reads_as_nothing() -> None:
    registry = CollectorRegistry()
    ControllerMetrics(registry)
    assert controller_actions(generate_latest(registry).decode()) == Counter()
