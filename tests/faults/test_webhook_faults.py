"""The webhook attacked at the wire, on a controller process: forged senders, header
tricks, deep bodies, unknown triggers, and the secrets it must refuse to start on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from tests.faults.rig import (
    ControllerProcess,
    controller_yaml,
    prepare_workdir,
    sign,
    start_controller,
    wait_for,
)

#: Five events per sender, and (practically) no refill: the limit does not hang on timing.
BURST = 5
BEHIND_A_PROXY = (
    "webhook: {host: 127.0.0.1, port: 0, source_header: X-Forwarded-For, "
    f"rate_per_s: 0.0001, burst: {BURST}}}\n"
)


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    """One controller behind a (pretend) proxy that sets X-Forwarded-For, leading."""
    config = controller_yaml().replace("webhook: {host: 127.0.0.1, port: 0}\n", BEHIND_A_PROXY)
    process = start_controller(prepare_workdir(tmp_path_factory.mktemp("webhook"), config=config))
    try:
        wait_for(lambda: process.get("/readyz").status_code == 200, timeout_s=60, what="leadership")
        yield process
    finally:
        process.stop()


def event(event_id: str, *, trigger: str = "brief.filed") -> bytes:
    body = {"type": "pipeline", "trigger": trigger, "tenant": "firm-east", "id": event_id}
    return json.dumps(body).encode()


def post(controller: ControllerProcess, body: bytes, *, sender: str, signed: bool = True) -> int:
    headers = sign(body) if signed else {"Content-Type": "application/json"}
    # The proxy appends the address it saw; what the sender wrote is further left.
    headers["X-Forwarded-For"] = f"6.6.6.6, {sender}"
    return controller.post("/v1/events", content=body, headers=headers).status_code


def test_unsigned_senders_cannot_spend_a_signed_senders_tokens(
    controller: ControllerProcess,
) -> None:
    forged = [
        post(controller, event(f"forged-{i}"), sender="10.1.0.1", signed=False) for i in range(120)
    ]
    signed = [post(controller, event(f"signed-{i}"), sender="10.1.0.1") for i in range(BURST)]
    assert set(forged) == {401}
    assert signed == [202] * BURST  # the whole burst is still there


def test_the_limit_is_per_sender_as_the_trusted_proxy_saw_it(controller: ControllerProcess) -> None:
    loud = [post(controller, event(f"loud-{i}"), sender="10.2.0.1") for i in range(BURST + 3)]
    quiet = post(controller, event("quiet-0"), sender="10.2.0.2")
    assert loud == [202] * BURST + [429] * 3
    assert quiet == 202


@pytest.mark.parametrize(
    "timestamp",
    [
        pytest.param("²", id="superscript-two"),
        pytest.param("١٧٠٠٠٠٠٠٠٠", id="arabic-indic-digits"),
        pytest.param("+1700000000", id="plus-sign"),
        pytest.param("-1", id="negative"),
    ],
)
def test_a_timestamp_that_is_not_ascii_digits_is_401_not_500(
    controller: ControllerProcess, timestamp: str
) -> None:
    body = event("odd-timestamp")
    headers = {
        **sign(body),
        "X-Lorafleet-Timestamp": timestamp,
        "X-Forwarded-For": "10.3.0.1",
    }
    response = controller.client.post(
        controller.url + "/v1/events",
        content=body,
        headers={k.encode(): v.encode("utf-8") for k, v in headers.items()},
    )
    assert response.status_code == 401
    assert "Unix seconds" in response.json()["detail"]


@pytest.mark.parametrize(
    ("depth", "status"),
    [
        pytest.param(100_000, 413, id="100k-deep-over-the-body-limit"),
        pytest.param(30_000, 422, id="30k-deep-within-the-limit"),
    ],
)
def test_a_deeply_nested_body_is_a_4xx(
    controller: ControllerProcess, depth: int, status: int
) -> None:
    body = b"[" * depth + b"]" * depth
    assert post(controller, body, sender=f"10.4.0.{depth % 250}") == status
    assert controller.get("/healthz").status_code == 200


def test_an_unknown_trigger_is_422(controller: ControllerProcess) -> None:
    body = event("unknown-trigger", trigger="no.such.trigger")
    headers = {**sign(body), "X-Forwarded-For": "10.5.0.1"}
    response = controller.post("/v1/events", content=body, headers=headers)
    assert response.status_code == 422
    assert "unknown trigger 'no.such.trigger'" in response.json()["detail"]
    assert "brief.filed" in response.json()["detail"]


def test_the_loop_survives_the_attacks_and_counts_the_failed_preloads(
    controller: ControllerProcess,
) -> None:
    # The accepted events' preloads went to pods that do not exist: failed, not fatal.
    assert controller.get("/healthz").json() == {"status": "ok", "problems": []}
    assert controller.metric("lorafleet_webhook_events_total", outcome="unauthorized") >= 120
    assert controller.process.poll() is None


# --- secrets the controller refuses to start on ---------------------------------------


def test_the_shipped_placeholder_secret_stops_the_process(tmp_path: Path) -> None:
    config = prepare_workdir(tmp_path, config=controller_yaml())
    placeholder = "replace-me-with-a-random-32-byte-value"
    process = start_controller(config, env={"LORAFLEET_WEBHOOK_SECRET": placeholder}, listen=False)
    try:
        assert process.process.wait(timeout=60) == 2
        assert "the webhook secret is the placeholder" in process.log()
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        pytest.param(" ", "the webhook secret is empty", id="one-space"),
        pytest.param("\t\n", "the webhook secret is empty", id="whitespace"),
        pytest.param("short-secret", "has 12 bytes; use at least 32", id="under-32-bytes"),
        pytest.param("a" * 40, "one byte repeated", id="one-byte-repeated"),
    ],
)
def test_a_weak_secret_stops_the_controller(tmp_path: Path, secret: str, message: str) -> None:
    (tmp_path / "secret").write_text(secret)
    body = controller_yaml().replace(
        "webhook: {host: 127.0.0.1, port: 0}", "webhook: {port: 0, secret_file: secret}"
    )
    config = prepare_workdir(tmp_path, config=body)
    result = CliRunner().invoke(app, ["controller", "-c", str(config)])
    assert result.exit_code == 2
    assert message in result.output
