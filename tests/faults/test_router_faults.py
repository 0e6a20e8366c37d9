"""The router's attacks that need a process: its loops on their own clock, its memory,
signals. Each test starts ``lorafleet router --port 0 --port-file`` in front of pods
emulated in this process (``tests.router.processes``), does the attack, and asserts
the answer, the loops, the memory (``/proc/<pid>/status``) or the log it leaves.

Stated bounds (docs/reliability.md): 10,000 random names grow the router's RSS by
under 8 MiB and add no label but ``_unknown``; 20 concurrent 300 MB bodies are each answered 413 and
raise its peak RSS by under 48 MiB; a SIGKILL loses only rows of requests answered
within the last flush interval (plus 0.5 s for the write itself on a loaded machine).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import string
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from placement.adapters.live_request_log import LiveRequestLog
from placement.adapters.request_log_files import (
    JsonLinesRequestLog,
    ParquetRequestLog,
)
from placement.inputs.request_log import load_request_log
from tests.factories import FakeClock
from tests.router.conftest import MetricsOverride, emulated
from tests.router.processes import RouterProcess, start_router, wait_for

MiB = 1024

NAN_METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="base-model"} NaN\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="base-model"} +Inf\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{model_name="base-model"} NaN\n'
)


def _post(router: RouterProcess, body: bytes, **headers: str) -> httpx.Response:
    return router.client.post(
        router.url + "/v1/completions",
        content=body,
        headers={"content-type": "application/json", **headers},
    )


def _completion(model: str = "base-model", **fields: object) -> bytes:
    return json.dumps({"model": model, "prompt": "p", "max_tokens": 1, **fields}).encode()


# --- the scrape loop ---------------------------------------------------------------------


def test_a_pod_answering_nan_neither_stops_the_scrape_loop_nor_keeps_a_pod_out(
    tmp_path: Path,
) -> None:
    pod_clock = FakeClock()
    override = MetricsOverride()
    override.texts["pod-0"] = NAN_METRICS
    with emulated(2, clock=pod_clock, metrics_override=override) as pods:
        router = start_router(tmp_path, urls=pods.urls)
        try:

            def healthy() -> list[str]:
                return [str(pod) for pod in router.health()["healthy_pods"]]

            # The NaN pod stays in: its NaN and infinite samples read as missing.
            assert healthy() == ["pod-0", "pod-1"]
            pods.fleet.pod("pod-1").kill(60.0)
            wait_for(lambda: healthy() == ["pod-0"], timeout_s=30, what="pod-1 to leave")
            pod_clock.advance(60.0)  # pod-1 comes back: the scrape loop must still run
            wait_for(lambda: healthy() == ["pod-0", "pod-1"], timeout_s=30, what="pod-1 back")
            answers = [_post(router, _completion(prompt=f"p{i}")) for i in range(6)]
            assert [a.status_code for a in answers] == [200] * 6
            health = router.health()
            assert health["status"] == "ok"
            assert health["loops"]["scrape"]["errors"] == 0
            assert router.metric("lorafleet_pod_queue_depth", pod="pod-0") == 0.0
            assert router.get("/readyz").status_code == 200
        finally:
            router.stop()


# --- the front door ----------------------------------------------------------------------

#: Each attack: what it is, its body, and the field the 400 names (None: the body).
ATTACKS: list[tuple[str, bytes, str | None]] = [
    ("model-lone-surrogate", b'{"model": "\\ud800", "prompt": "p"}', "model"),
    ("user-lone-surrogate", b'{"model": "base-model", "user": "\\ud800", "prompt": "p"}', "user"),
    ("empty-model", b'{"model": "", "prompt": "p"}', "model"),
    ("path-as-model", b'{"model": "../../etc/passwd"}', "model"),
    ("nested-100000-deep", b"[" * 100_000 + b"]" * 100_000, None),
    ("objects-60000-deep", b'{"model": ' * 60_000 + b"1" + b"}" * 60_000, None),
    ("not-utf8", b"\xff\xfe not json", None),
]


def test_bad_names_users_and_bodies_are_4xx_and_sigterm_closes_a_whole_log(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "requests"
    with emulated(1) as pods:
        router = start_router(tmp_path, urls=pods.urls, args=["--request-log", str(log_dir)])
        try:
            answered: list[httpx.Response] = []
            for name, body, field in ATTACKS:
                answer = _post(router, body)
                assert answer.status_code == 400, (name, answer.text)
                assert answer.json()["error"]["param"] == field, name
                answered.append(_post(router, _completion(), **{"x-tenant": f"t{len(answered)}"}))
            assert [a.status_code for a in answered] == [200] * len(ATTACKS)
            health = router.health()
            assert health["status"] == "ok", health
            assert health["loops"]["log"]["errors"] == 0
            metrics = router.get("/metrics").text
            assert "ud800" not in metrics and "etc/passwd" not in metrics
            assert router.metric("lorafleet_router_refused_requests_total", reason="bad_model") == 3
            code = router.terminate()
        finally:
            router.stop()
    # uvicorn shuts down gracefully, then re-raises the signal: -15 after a clean stop.
    assert code in (0, -signal.SIGTERM), router.log()
    assert "Application shutdown complete" in router.log()
    # The log was closed on SIGTERM: one compacted file per hour (two if the hour
    # turned during the test), no parts left, each readable whole.
    files = sorted(log_dir.iterdir())
    assert 1 <= len(files) <= 2 and all(".part" not in p.name for p in files), files
    tenants = [t for p in files for t in pq.read_table(p).column("tenant").to_pylist()]
    assert sorted(tenants) == sorted(f"t{i}" for i in range(len(ATTACKS)))


# --- memory ------------------------------------------------------------------------------

CATALOG = "adapters:\n" + "".join(
    f"  - {{name: known-{i}, base_model: llama-3.1-8b, rank: 8, source: s3://a/known-{i}}}\n"
    for i in range(4)
)


def _random_names(count: int, *, seed: int) -> Iterator[str]:
    """Half names an adapter could have (none the router knows), half names none can."""
    rng = random.Random(seed)
    alphabet = string.ascii_lowercase + string.digits
    odd = ["UPPER", "under_score", "\ud800", "a" * 80, "sp ace", "../x", "é"]
    for i in range(count):
        if i % 2:
            yield "".join(rng.choices(alphabet, k=24))
        else:
            yield f"{rng.choice(odd)}-{rng.randrange(10**9)}"


async def _send_names(url: str, names: Iterator[str], *, connections: int = 8) -> dict[int, int]:
    """POST a completion for each name over a few keep-alive connections (raw HTTP/1.1:
    a client library would cost more CPU than the router); the count of each status."""
    address = httpx.URL(url)
    statuses: dict[int, int] = {}

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(address.host, address.port)
        try:
            for name in names:  # one shared iterator: the connections split the names
                body = json.dumps({"model": name, "prompt": "p", "max_tokens": 1}).encode()
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nhost: router\r\n"
                    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                status = int(head.split()[1])
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return statuses


def test_ten_thousand_random_names_keep_memory_metrics_and_unplanned_bounded(
    tmp_path: Path,
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    with emulated(2) as pods:
        router = start_router(tmp_path, urls=pods.urls, args=["--catalog", str(catalog)])
        try:
            assert _post(router, _completion("known-1")).status_code == 200
            asyncio.run(_send_names(router.url, _random_names(500, seed=1)))  # warm up
            metrics_before = router.get("/metrics").text
            rss_before = router.rss_kib()
            statuses = asyncio.run(_send_names(router.url, _random_names(10_000, seed=2)))
            rss_after = router.rss_kib()
            metrics_after = router.get("/metrics").text
            unplanned = router.get("/v1/unplanned").json()["adapters"]
            assert router.health()["status"] == "ok"
        finally:
            router.stop()
    # Unknown names: 404 from the router (no pod could load them); others 400.
    assert statuses == {404: 5_000, 400: 5_000}
    assert rss_after - rss_before < 8 * MiB, (rss_before, rss_after)
    assert len(metrics_after) < len(metrics_before) + 2_000
    assert set(unplanned) <= {"_unknown", "known-1"}
    adapters = {line.split('adapter="')[1].split('"')[0]
                for line in metrics_after.splitlines() if 'adapter="' in line}  # fmt: skip
    assert adapters <= {"known-1", "_unknown"}


async def _send_huge_body(host: str, port: int, *, size: int, chunked: bool) -> tuple[int, int]:
    """Send a ``size``-byte body from one reused 1 MiB chunk until the router answers;
    the status, and how many bytes went before the answer came."""
    reader, writer = await asyncio.open_connection(host, port)
    framing = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % size
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
        + framing
        + b"\r\n\r\n"
    )
    chunk = b"x" * (1024 * 1024)
    head = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
    sent = 0
    try:
        while sent < size and not head.done():
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            await writer.drain()
            sent += len(chunk)
            await asyncio.sleep(0)
        status_line = await asyncio.wait_for(head, timeout=60)
    finally:
        head.cancel()
        writer.close()
    return int(status_line.split()[1]), sent


def test_twenty_concurrent_300_mb_bodies_are_413_and_never_buffered(tmp_path: Path) -> None:
    with emulated(1) as pods:
        router = start_router(tmp_path, urls=pods.urls)
        try:
            assert _post(router, _completion()).status_code == 200
            rss_before = router.rss_kib()
            url = httpx.URL(router.url)

            async def attack() -> list[tuple[int, int]]:
                return await asyncio.gather(
                    *(
                        _send_huge_body(
                            url.host, url.port or 80, size=300 * 10**6, chunked=i % 2 == 1
                        )
                        for i in range(20)
                    )
                )

            answers = asyncio.run(attack())
            peak = router.peak_rss_kib()
            assert _post(router, _completion()).status_code == 200  # still serving
        finally:
            router.stop()
    assert [status for status, _ in answers] == [413] * 20
    assert all(sent < 300 * 10**6 for _, sent in answers)
    assert peak - rss_before < 48 * MiB, (rss_before, peak)


# --- the request log under SIGKILL ---------------------------------------------------------

FLUSH_S = 0.2
#: What a flush may take to reach the file on a loaded two-core machine.
WRITE_SLACK_S = 0.5


def _request(body: bytes, **headers: str) -> bytes:
    """One HTTP/1.1 POST /v1/completions, written in one piece."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
        + head.encode()
        + b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )


async def _answer(reader: asyncio.StreamReader) -> int:
    """Read one response with a Content-Length; its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return int(head.split()[1])


def _traffic(url: str, stop: threading.Event, done: dict[str, float]) -> None:
    """Requests on 8 keep-alive connections, each with its own tenant, noting when each
    was answered (monotonic seconds), until ``stop`` or the router dies."""
    address = httpx.URL(url)
    names = (f"r{index:06d}" for index in range(10**6))

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(address.host, address.port)
        try:
            for tenant in names:
                if stop.is_set():
                    return
                writer.write(_request(_completion(), **{"x-tenant": tenant}))
                if await _answer(reader) == 200:
                    done[tenant] = time.monotonic()
        except (OSError, asyncio.IncompleteReadError):
            return  # killed
        finally:
            writer.close()

    async def connections() -> None:
        await asyncio.gather(*(connection() for _ in range(8)))

    asyncio.run(connections())


@pytest.mark.parametrize("layout", ["parquet", "jsonl"])
def test_sigkill_loses_at_most_the_last_flush_interval_and_leaves_readable_files(
    tmp_path: Path, layout: str
) -> None:
    target = tmp_path / ("requests" if layout == "parquet" else "requests.jsonl")
    args = ["--request-log", str(target), "--log-flush-s", str(FLUSH_S)]
    if layout == "jsonl":
        args += ["--log-rotate-bytes", "20000"]  # rotates a few times during the test
    done: dict[str, float] = {}
    stop = threading.Event()
    with emulated(1) as pods:
        router = start_router(tmp_path, urls=pods.urls, args=args)
        sender = threading.Thread(target=_traffic, args=(router.url, stop, done))
        sender.start()
        try:
            wait_for(lambda: len(done) >= 300, timeout_s=60, what="300 answered requests")
            router.process.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            router.process.wait(timeout=30)
        finally:
            stop.set()
            sender.join(timeout=30)
            router.stop()
    logged = set(LiveRequestLog(target).read().frame["tenant"])
    lost = {tenant for tenant in done if tenant not in logged}
    deadline = killed_at - FLUSH_S - WRITE_SLACK_S
    assert {t for t in lost if done[t] < deadline} == set(), "rows older than a flush were lost"
    assert len(logged) >= len(done) - len(lost) and logged >= set(done) - lost
    # Every file it left is readable as it is; a restarted writer tidies the rest.
    if layout == "parquet":
        files = [p for p in target.iterdir() if not p.name.startswith(".")]
        assert files and all(pq.read_table(p).num_rows > 0 for p in files)
        ParquetRequestLog(target).close()  # what a restart does: debris gone, compacted
        assert [p.name for p in target.iterdir() if p.name.startswith(".")] == []
        assert len(list(target.iterdir())) <= 2
    else:
        rotated = [p for p in tmp_path.iterdir() if p.name.startswith("requests.2")]
        assert rotated, "the log rotated"
        JsonLinesRequestLog(target).close()  # cuts a half-written last line
        for path in [*rotated, target]:
            if path.stat().st_size == 0:
                continue  # killed just after a rotation: the new file holds no line yet
            load_request_log(path)  # strict: raises on a bad line
    assert LiveRequestLog(target).read().frame["tenant"].is_unique
