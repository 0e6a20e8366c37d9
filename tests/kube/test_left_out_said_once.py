"""A pod left out of the discovery is warned of once while it stays left out for the same
reason; each later poll or watch event says it at DEBUG only. A new reason, or the pod
coming right and breaking again, warns again; a pod gone from the listing is forgotten.

Both the cluster adapter (``placement.adapters.kube``: no name, no pool label, an empty
one) and the router's pod source (``placement.router.kube_sources``: labels it cannot
read), through the official client against the fake API server of ``tests.controller``
(the watch against ``tests.pods.wire_server``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest
from kubernetes import client

from placement.adapters.kube import KubePods, KubeTarget, connect
from placement.router.kube_sources import DiscoveryPodSource
from tests.controller.controller_kubefake import FakeApiServer, make_pod
from tests.pods.wire_server import Answer, WireServer

TARGET = KubeTarget(namespace="lf", request_timeout_s=2.0)
KUBE = "placement.adapters.kube"
ROUTER = "lorafleet.router"
EMPTY = "pod pod-a: label lorafleet.io/pool is empty: it names no pool; left out"
NO_POOL = "pod pod-a has no lorafleet.io/pool label; left out"
NAMELESS = "a pod the API listed has no metadata.name (pod IP 10.0.0.9); left out"
SLOTS = "lorafleet.io/max-loras"


@pytest.fixture
def fake() -> Iterator[tuple[FakeApiServer, client.ApiClient]]:
    server = FakeApiServer().start()
    api = connect(host=server.url)
    yield server, api
    api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
    server.stop()


def _said(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[str, str]]:
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger]
    caplog.clear()
    return said


# --- placement.adapters.kube ---------------------------------------------------------------

LEFT_OUT = [
    pytest.param(make_pod("pod-a", pool=""), EMPTY, id="empty-pool-label"),
    pytest.param(make_pod("pod-a", pool=None), NO_POOL, id="no-pool-label"),
    pytest.param(make_pod("", ip="10.0.0.9"), NAMELESS, id="no-name"),
]


@pytest.mark.parametrize(("bad", "why"), LEFT_OUT)
def test_two_polls_with_the_same_bad_pod_warn_once_then_say_it_at_debug(
    fake: tuple[FakeApiServer, client.ApiClient],
    caplog: pytest.LogCaptureFixture,
    bad: dict[str, object],
    why: str,
) -> None:
    caplog.set_level(logging.DEBUG, logger=KUBE)
    server, api = fake
    server.put("pods", bad)
    server.put("pods", make_pod("pod-b", ip="10.0.0.2"))
    pods = KubePods(api, target=TARGET)
    for _ in range(3):
        assert [str(p.name) for p in pods.list_pods()] == ["pod-b"]
    assert _said(caplog, KUBE) == [("WARNING", why), ("DEBUG", why), ("DEBUG", why)]


def test_a_changed_reason_warns_again(
    fake: tuple[FakeApiServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=KUBE)
    server, api = fake
    pods = KubePods(api, target=TARGET)
    server.put("pods", make_pod("pod-a", pool=""))
    pods.list_pods()
    server.put("pods", make_pod("pod-a", pool=None))
    pods.list_pods()
    pods.list_pods()
    assert _said(caplog, KUBE) == [("WARNING", EMPTY), ("WARNING", NO_POOL), ("DEBUG", NO_POOL)]


def test_a_pod_fixed_then_broken_again_or_gone_and_back_warns_again(
    fake: tuple[FakeApiServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=KUBE)
    server, api = fake
    pods = KubePods(api, target=TARGET)
    server.put("pods", make_pod("pod-a", pool=""))
    pods.list_pods()
    server.put("pods", make_pod("pod-a", pool="llama"))  # fixed
    assert [str(p.name) for p in pods.list_pods()] == ["pod-a"]
    server.put("pods", make_pod("pod-a", pool=""))  # broken again
    pods.list_pods()
    pods.list_pods()
    server.delete("pods", "pod-a")  # gone: forgotten
    pods.list_pods()
    server.put("pods", make_pod("pod-a", pool=""))  # back, as broken
    pods.list_pods()
    assert _said(caplog, KUBE) == [
        ("WARNING", EMPTY),
        ("WARNING", EMPTY),
        ("DEBUG", EMPTY),
        ("WARNING", EMPTY),
    ]


def _events(*pairs: tuple[str, dict[str, object]]) -> Answer:
    lines = (json.dumps({"type": kind, "object": obj}).encode() + b"\n" for kind, obj in pairs)
    return Answer(body=b"".join(lines))


def test_a_watch_warns_once_per_pod_and_reason_and_forgets_a_deleted_pod(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=KUBE)
    server = WireServer().start()
    api = connect(host=server.url)
    try:
        bad = make_pod("pod-a", pool="")
        server.answers["GET /api/v1/namespaces/lf/pods"] = _events(
            ("ADDED", bad),
            ("MODIFIED", bad),  # the same reason: DEBUG
            ("MODIFIED", make_pod("pod-a", pool=None)),  # a new one: WARNING
            ("DELETED", make_pod("pod-a", pool=None)),  # forgotten
            ("ADDED", bad),  # back, as broken: WARNING
            ("ADDED", make_pod("pod-b", ip="10.0.0.2")),
        )
        seen = list(KubePods(api, target=TARGET).watch_pods(timeout_s=1))
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
        server.stop()
    assert [str(event.pod.name) for event in seen] == ["pod-b"]
    assert _said(caplog, KUBE) == [
        ("WARNING", EMPTY),
        ("DEBUG", EMPTY),
        ("WARNING", NO_POOL),
        ("WARNING", EMPTY),
    ]


# --- placement.router.kube_sources ----------------------------------------------------------


def _not_a_count(value: str) -> str:
    accepted = "a whole number of at least 1, in decimal digits"
    why = f"pod pod-a: label {SLOTS}: {value!r} is not a slot count (accepted: {accepted})"
    return f"selector: {why}; left out"


def _poll(source: DiscoveryPodSource) -> list[str]:
    return [str(u.pod) for u in asyncio.run(source.upstreams())]


def test_the_router_warns_once_per_pod_and_reason_and_says_repeats_at_debug(
    fake: tuple[FakeApiServer, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=ROUTER)
    server, api = fake
    source = DiscoveryPodSource(KubePods(api, target=TARGET))
    server.put("pods", make_pod("pod-a", labels={SLOTS: "four"}))
    server.put("pods", make_pod("pod-b", ip="10.0.0.2"))
    assert _poll(source) == ["pod-b"]
    assert _poll(source) == ["pod-b"]
    assert _said(caplog, ROUTER) == [
        ("WARNING", _not_a_count("four")),
        ("DEBUG", _not_a_count("four")),
    ]
    server.put("pods", make_pod("pod-a", labels={SLOTS: "0"}))  # a new reason
    _poll(source)
    server.put("pods", make_pod("pod-a", labels={SLOTS: "4"}))  # fixed
    assert _poll(source) == ["pod-a", "pod-b"]
    server.put("pods", make_pod("pod-a", labels={SLOTS: "0"}))  # broken again
    _poll(source)
    _poll(source)
    assert _said(caplog, ROUTER) == [
        ("WARNING", _not_a_count("0")),
        ("WARNING", _not_a_count("0")),
        ("DEBUG", _not_a_count("0")),
    ]
