"""The router's front door under attack, on the composed app served in a thread
(``tests.router.conftest.router_for``: uvicorn on port 0, emulated pods on sockets):
bodies too large or too deep, names that are no names, users that are not text,
random names, and readiness. ``test_router_faults.py`` does the same against a
process where memory or signals matter.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from placement.plan import plan_to_json
from placement.settings import Settings
from tests.router.conftest import MANUAL, Running, catalog_of, emulated, plan_of, router_for

SMALL = replace(MANUAL, router=replace(MANUAL.router, max_body_bytes=1000, max_json_depth=16))


@dataclass(frozen=True)
class Answer:
    status_code: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _post(router: Running, body: bytes, **headers: str) -> Answer:
    """POST /v1/completions with http.client, which sends head and body in one write
    (two small writes wait out the peer's delayed ACK: 40 ms a request)."""
    address = httpx.URL(router.url)
    connection = http.client.HTTPConnection(address.host, address.port, timeout=10)
    try:
        connection.request(
            "POST",
            "/v1/completions",
            body=body,
            headers={"content-type": "application/json", **headers},
        )
        answer = connection.getresponse()
        return Answer(answer.status, answer.read())
    finally:
        connection.close()


def _completion(model: str = "base-model", **fields: object) -> bytes:
    return json.dumps({"model": model, "prompt": "p", "max_tokens": 1, **fields}).encode()


def _refused(router: Running, reason: str) -> float:
    value = router.registry.get_sample_value(
        "lorafleet_router_refused_requests_total", {"reason": reason}
    )
    return value or 0.0


def _adapter_labels(router: Running) -> set[str]:
    text = router.get("/metrics")
    return {
        line.split('adapter="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("lorafleet_") and 'adapter="' in line
    }


# --- sizes ----------------------------------------------------------------------------


def test_a_body_declared_over_the_limit_is_413_before_a_byte_of_it_is_sent() -> None:
    with emulated(1) as pods, router_for(pods.domain, settings=SMALL) as router:
        address = httpx.URL(router.url)
        with socket.create_connection((address.host, address.port), timeout=10) as raw:
            raw.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: router\r\n"
                b"content-type: application/json\r\ncontent-length: 300000000\r\n\r\n"
            )  # and not one byte of the body
            head = raw.recv(65536)
        assert head.startswith(b"HTTP/1.1 413 ")
        assert _refused(router, "body_too_large") == 1.0


@pytest.mark.parametrize("size", [1001, 10**6], ids=["one-byte-over", "a-megabyte"])
def test_a_body_without_a_length_is_read_only_up_to_the_limit(size: int) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "base-model", "prompt": "'
        yield b"x" * size

    with emulated(1) as pods, router_for(pods.domain, settings=SMALL) as router:
        answer = httpx.post(router.url + "/v1/completions", content=chunks(), timeout=10)
        assert answer.status_code == 413
        assert answer.json()["error"]["code"] == 413
        at_limit = _completion(prompt="x" * (1000 - len(_completion(prompt=""))))
        assert len(at_limit) == 1000 and _post(router, at_limit).status_code == 200
        assert router.log.rows == [] or all(row.status == 200 for row in router.log.rows)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="list-100000-deep"),
        pytest.param(b'{"a":' * 100_000 + b"1" + b"}" * 100_000, id="object-100000-deep"),
        pytest.param(
            json.dumps(
                {"model": "base-model", "tools": [{"a": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}]}
            ).encode(),
            id="a-request-20-deep",
        ),
    ],
)
def test_a_deeply_nested_body_is_a_400_not_a_500(body: bytes) -> None:
    settings = replace(MANUAL, router=replace(MANUAL.router, max_json_depth=16))
    with emulated(1) as pods, router_for(pods.domain, settings=settings) as router:
        answer = _post(router, body)
        assert answer.status_code == 400
        assert "deeper than 16 levels" in answer.json()["error"]["message"]
        assert _refused(router, "too_deep") == 1.0
        nested = {"model": "base-model", "prompt": "p", "max_tokens": 1, "x": [[[[[[1]]]]]]}
        assert _post(router, json.dumps(nested).encode()).status_code == 200
        assert router.get("/healthz")["status"] == "ok"


# --- names and users -----------------------------------------------------------------

NO_NAMES = [
    pytest.param(b'"\\ud800"', id="lone-surrogate"),
    pytest.param(b'""', id="empty"),
    pytest.param(b'"Alpha"', id="upper-case"),
    pytest.param(b'"' + b"a" * 64 + b'"', id="64-characters"),
    pytest.param(b'"s3://adapters/alpha"', id="a-url"),
    pytest.param(b'"alpha\\n"', id="newline"),
    pytest.param(b"5", id="a-number"),
    pytest.param(b"null", id="null"),
]


@pytest.mark.parametrize("model", NO_NAMES)
def test_a_model_that_is_no_name_is_400_with_no_label_and_no_log_row(model: bytes) -> None:
    catalog = catalog_of(["alpha"])
    with emulated(1) as pods, router_for(pods.domain, catalog=catalog) as router:
        answer = _post(router, b'{"model": ' + model + b', "prompt": "p"}')
        assert answer.status_code == 400
        assert answer.json()["error"]["param"] == "model"
        assert _refused(router, "bad_model") == 1.0
        assert _adapter_labels(router) == set()
        assert _post(router, _completion("alpha")).status_code == 200
        assert router.get("/healthz")["loops"]["log"]["errors"] == 0
    assert [row.adapter for row in router.log.rows] == ["alpha"]


def test_a_user_that_is_not_text_is_400_and_a_long_one_is_cut_in_the_log() -> None:
    with emulated(1) as pods, router_for(pods.domain) as router:
        bad = _post(router, b'{"model": "base-model", "user": "\\ud800", "prompt": "p"}')
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "user"
        assert _post(router, _completion(user=5)).status_code == 400
        assert _post(router, _completion(user="u" * 10_000)).status_code == 200
        assert _post(router, _completion(), **{"x-tenant": "t" * 10_000}).status_code == 200
        assert _refused(router, "bad_user") == 2.0
    assert [len(row.tenant or "") for row in router.log.rows] == [256, 256]


# --- random names ----------------------------------------------------------------------

RANDOM = [f"n{index:05d}-zz" for index in range(60)]


def test_names_the_router_does_not_know_share_one_label_and_stay_out_of_the_ledger() -> None:
    plan = plan_of({"alpha": ["pod-0"]})
    with emulated(2) as pods, router_for(pods.domain, plan=plan) as router:  # no catalog
        load = {"lora_name": "alpha", "lora_path": "s3://adapters/alpha"}
        httpx.post(pods.url("pod-0") + "/v1/load_lora_adapter", json=load).raise_for_status()
        assert _post(router, _completion("alpha")).status_code == 200
        before = {
            pod: list(state.ledger.active_view)
            for pod, state in router.router.topology.pods.items()
        }
        statuses = {_post(router, _completion(name)).status_code for name in RANDOM}
        after = {
            pod: list(state.ledger.active_view)
            for pod, state in router.router.topology.pods.items()
        }
        unplanned = router.get("/v1/unplanned")["adapters"]
        assert statuses == {404}  # each went to its hashed pod, which does not have it
        assert len(pods.answers) == 1 + len(RANDOM)  # each sent once: no reload and retry
        assert after == before  # the ledger's GPU sets did not take the unknown names
        assert _adapter_labels(router) == {"alpha", "_unknown"}
        assert unplanned == {"_unknown": len(RANDOM)}


def test_with_a_catalog_an_unknown_name_is_404_from_the_router_and_never_reaches_a_pod() -> None:
    with emulated(1) as pods, router_for(pods.domain, catalog=catalog_of(["alpha"])) as router:
        answers = [_post(router, _completion(name)) for name in RANDOM]
        assert {answer.status_code for answer in answers} == {404}
        assert "does not exist" in answers[0].json()["error"]["message"]
        assert len(pods.answers) == 0
        assert _adapter_labels(router) == {"_unknown"}
    assert len(router.log.rows) == len(RANDOM)  # logged: requests the clients made, refused


def test_known_names_beyond_max_adapter_labels_share_the_label() -> None:
    names = ["alpha", "beta", "gamma", "delta"]
    settings = replace(MANUAL, router=replace(MANUAL.router, max_adapter_labels=2))
    with (
        emulated(1, max_loras=4) as pods,
        router_for(pods.domain, catalog=catalog_of(names), settings=settings) as router,
    ):
        for name in names:
            assert _post(router, _completion(name)).status_code == 200
        assert _adapter_labels(router) == {"alpha", "beta", "_unknown"}


# --- readiness -------------------------------------------------------------------------


def test_ready_only_with_a_plan_where_one_is_expected_and_a_healthy_pod(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    with emulated(2) as pods, router_for(pods.domain, plan=path) as router:
        ready = httpx.get(router.url + "/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["reasons"] == [f"no plan yet: {path}: no such file"]
        assert httpx.get(router.url + "/healthz", timeout=10).status_code == 200  # alive
        path.write_text(plan_to_json(plan_of({"alpha": ["pod-0"]})))
        router.refresh_plan()
        assert httpx.get(router.url + "/readyz", timeout=10).status_code == 200
        for handle in pods.fleet.handles:
            handle.pod.kill(3600.0)
        router.scrape()
        ready = httpx.get(router.url + "/readyz", timeout=10)
        assert (ready.status_code, ready.json()["reasons"]) == (503, ["no healthy pod"])


def test_without_a_plan_source_or_following_one_no_plan_is_needed(tmp_path: Path) -> None:
    reactive = replace(MANUAL, router=replace(MANUAL.router, policy="least-loaded"))
    with emulated(1) as pods:
        for plan, settings in ((None, MANUAL), (tmp_path / "absent.json", reactive)):
            with router_for(pods.domain, plan=plan, settings=settings) as router:
                assert httpx.get(router.url + "/readyz", timeout=10).status_code == 200


def test_settings_default_to_a_one_mebibyte_body_and_bounded_labels() -> None:
    router = Settings().router
    assert router.max_body_bytes == 1024 * 1024
    assert router.max_adapter_labels == 10_000
