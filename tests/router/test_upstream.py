"""The proxy's upstream client at the wire: a scripted fake pod on a real socket (what it
answers, byte for byte, per request) and emulated vLLM pods.

No sleeps: a test waits on the client's own answers; the one timeout is the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import Engine
from placement.router.upstream import (
    PoolFullError,
    Reply,
    UpstreamError,
    Upstreams,
    UpstreamTimeoutError,
)
from tests.ports import is_held, refusing_port

from .conftest import emulated, read_request

pytestmark = pytest.mark.anyio

POD = "pod-7"
#: Close the connection without answering.
CLOSE = b"<close>"
#: Never answer (until the test ends).
HANG = b"<hang>"


def ok(body: bytes, *, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    return head + b"content-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunked(parts: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts if part)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    head += b"transfer-encoding: chunked\r\n\r\n"
    return head + body + b"0\r\n\r\n"


@dataclass
class FakePod:
    """Answers each request with the next script; records requests and connections."""

    answers: list[bytes | list[bytes]]
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    handlers: list[asyncio.Task[None]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.append(task)
        try:
            while True:
                self.requests.append(await read_request(reader))
                answer = self.answers.pop(0)
                if answer == CLOSE:
                    return
                if answer == HANG:
                    await asyncio.Event().wait()
                for piece in answer if isinstance(answer, list) else [answer]:
                    if piece == CLOSE:  # after the pieces before it
                        return
                    writer.write(piece)
                    await writer.drain()
                if b"connection: close" in (answer if isinstance(answer, bytes) else b""):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/completions"


@contextlib.asynccontextmanager
async def fake_pod(*answers: bytes | list[bytes]) -> AsyncIterator[FakePod]:
    pod = FakePod(list(answers))
    server = await asyncio.start_server(pod.handle, "127.0.0.1", 0)
    pod.port = server.sockets[0].getsockname()[1]
    try:
        yield pod
    finally:
        server.close()
        for task in pod.handlers:
            task.cancel()
        await asyncio.gather(*pod.handlers, return_exceptions=True)


def upstreams(
    *, timeout_s: float = 10.0, keepalive_s: float = 4.0, max_connections: int = 64
) -> Upstreams:
    return Upstreams(
        timeout_s=timeout_s,
        connect_timeout_s=5.0,
        keepalive_s=keepalive_s,
        max_connections=max_connections,
    )


async def answer(client: Upstreams, url: str, body: bytes = b"{}") -> tuple[int, bytes]:
    reply = await client.post(POD, url, body)
    try:
        return reply.status, await reply.read()
    finally:
        reply.release()


async def test_content_length_bodies_and_one_kept_alive_connection() -> None:
    async with fake_pod(ok(b'{"a":1}'), ok(b'{"b":2}', extra=b"retry-after: 3\r\n")) as pod:
        client = upstreams()
        assert await answer(client, pod.url, b'{"x":1}') == (200, b'{"a":1}')
        reply = await client.post(POD, pod.url, b"{}", auth=b"Bearer t")
        assert reply.headers[b"retry-after"] == b"3"
        assert await reply.read() == b'{"b":2}'
        reply.release()
        assert pod.connections == 1
        assert client.idle_connections == 1
        head, body = pod.requests[0]
        assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"Content-Length: 7\r\n" in head and body == b'{"x":1}'
        assert b"Authorization: Bearer t\r\n" in pod.requests[1][0]
        await client.close()


async def test_a_chunked_stream_comes_back_chunk_by_chunk_unchanged() -> None:
    events = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
    pieces = [chunked(events)[:90], chunked(events)[90:]]
    async with fake_pod(pieces, ok(b"again")) as pod:
        client = upstreams()
        reply = await client.post(POD, pod.url, b"{}")
        assert reply.headers[b"content-type"] == b"text/event-stream"
        got = []
        while part := await reply.chunk():
            got.append(part)
        reply.release()
        assert b"".join(got) == b"".join(events)
        assert await answer(client, pod.url) == (200, b"again")  # the same connection
        assert pod.connections == 1
        await client.close()


async def test_a_body_that_ends_with_the_connection_is_read_and_not_reused() -> None:
    until_close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it"
    async with fake_pod(until_close, ok(b"next")) as pod:
        client = upstreams()
        assert await answer(client, pod.url) == (200, b"all of it")
        assert client.idle_connections == 0
        assert await answer(client, pod.url) == (200, b"next")
        assert pod.connections == 2
        await client.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"HTTX/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
    ],
)
async def test_a_malformed_answer_is_an_error_naming_the_pod(garbage: bytes) -> None:
    async with fake_pod(garbage) as pod:
        client = upstreams()
        with pytest.raises(UpstreamError, match=f"pod {POD} answered malformed HTTP"):
            await client.post(POD, pod.url, b"{}")
        assert client.open_connections == 0
        await client.close()


async def test_a_pod_that_closes_before_answering_is_not_retried_on_a_fresh_connection() -> None:
    async with fake_pod(CLOSE, ok(b"never")) as pod:
        client = upstreams()
        with pytest.raises(UpstreamError, match=f"pod {POD} closed the connection before"):
            await client.post(POD, pod.url, b"{}")
        assert pod.connections == 1
        await client.close()


async def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    async with fake_pod(ok(b"first"), CLOSE, ok(b"second")) as pod:
        client = upstreams()
        assert await answer(client, pod.url) == (200, b"first")
        assert await answer(client, pod.url) == (200, b"second")
        assert pod.connections == 2
        assert len(pod.requests) == 3  # the stale connection took the request, then closed
        await client.close()


async def test_a_pod_that_closes_mid_answer_fails_the_read() -> None:
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b"
    async with fake_pod([cut, CLOSE]) as pod:
        client = upstreams()
        reply = await client.post(POD, pod.url, b"{}")
        with pytest.raises(UpstreamError, match=f"pod {POD} closed the connection during"):
            await reply.read()
        reply.release()
        assert client.open_connections == 0
        await client.close()


async def test_an_answer_waited_for_whole_has_its_head_and_body_however_they_came() -> None:
    split = ok(b'{"whole":1}')
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b"
    head_then_body = [split[:-11], split[-11:]]  # the head in one write, the body in another
    async with fake_pod(head_then_body, ok(b"first"), CLOSE, ok(b"again"), [cut, CLOSE]) as pod:
        client = upstreams()
        reply = await client.post(POD, pod.url, b"{}", whole=True)
        assert (reply.status, reply.headers[b"content-type"]) == (200, b"application/json")
        assert await reply.read() == b'{"whole":1}'
        reply.release()
        reply = await client.post(POD, pod.url, b"{}", whole=True)
        assert await reply.read() == b"first"
        reply.release()
        reply = await client.post(POD, pod.url, b"{}", whole=True)  # stale: a fresh one
        assert await reply.read() == b"again"
        reply.release()
        with pytest.raises(UpstreamError, match=f"pod {POD} closed the connection during"):
            await client.post(POD, pod.url, b"{}", whole=True)
        assert (pod.connections, len(pod.requests)) == (2, 5)  # the stale one took its request
        assert client.open_connections == 0
        await client.close()


async def test_a_pod_that_does_not_answer_in_time_is_a_timeout_naming_it() -> None:
    async with fake_pod(HANG) as pod:
        client = upstreams(timeout_s=0.5)  # a connect on a starved machine fits in it
        with pytest.raises(UpstreamTimeoutError, match=f"pod {POD} did not answer within 0.5 s"):
            await client.post(POD, pod.url, b"{}")
        assert client.open_connections == 0
        await client.close()


async def test_a_refused_connection_names_the_pod_and_its_address() -> None:
    client = upstreams()
    with refusing_port() as port:  # held for the whole test: no one else may take it
        said = f"pod {POD}: connecting to 127.0.0.1:{port} failed"
        with pytest.raises(UpstreamError, match=said):
            await client.post(POD, f"http://127.0.0.1:{port}/v1/completions", b"{}")
        assert is_held(port)
    assert isinstance(UpstreamError("x"), OSError)  # what the proxy's callers catch
    await client.close()


async def test_an_idle_connection_past_the_keep_alive_is_not_reused() -> None:
    async with fake_pod(ok(b"1"), ok(b"2")) as pod:
        client = upstreams(keepalive_s=-1.0)  # every idle connection is past it
        await answer(client, pod.url)
        await answer(client, pod.url)
        assert pod.connections == 2
        assert client.open_connections == 1
        await client.close()


async def test_an_idle_connection_the_pod_closes_leaves_the_pool() -> None:
    async with fake_pod([ok(b"1"), CLOSE], ok(b"2")) as pod:
        client = upstreams(max_connections=1)
        assert await answer(client, pod.url) == (200, b"1")
        for _ in range(1000):  # loop turns, no clock: until the pod's FIN is read
            if client.open_connections == 0:
                break
            await asyncio.sleep(0)
        assert (client.open_connections, client.idle_connections) == (0, 0)
        assert await answer(client, pod.url) == (200, b"2")
        assert pod.connections == 2
        await client.close()


async def test_past_max_connections_a_request_waits_for_one_to_be_released() -> None:
    async with fake_pod(ok(b"1"), ok(b"2")) as pod:
        client = upstreams(max_connections=1)
        held: Reply = await client.post(POD, pod.url, b"{}")
        second = asyncio.create_task(answer(client, pod.url))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not second.done()
        assert await held.read() == b"1"
        held.release()
        assert await second == (200, b"2")
        assert pod.connections == 1
        await client.close()


async def test_a_full_pool_until_the_deadline_is_the_routers_limit_not_the_pods() -> None:
    """Waiting for a connection counts against the request's deadline; past it the
    error is ``PoolFullError`` (not an ``OSError``: the pod is not to blame). The
    waiting request's deadline comes well before the hanging one's: with the two at
    the same time, a slow machine let the hanging one's timeout free the connection
    first, and the waiter then timed out on the pod instead."""
    async with fake_pod(HANG) as pod:
        client = upstreams(timeout_s=1.5, max_connections=1)
        hanging = asyncio.create_task(client.post(POD, pod.url, b"{}"))
        while client.open_connections == 0:
            await asyncio.sleep(0)
        client.timeout_s = 0.2  # the waiting request's deadline
        with pytest.raises(PoolFullError, match="1 open"):
            await client.post(POD, pod.url, b"{}")
        assert not issubclass(PoolFullError, OSError)
        with pytest.raises(UpstreamTimeoutError):  # the hanging one's own deadline
            await hanging
        await client.close()


async def test_a_request_times_out_at_its_own_deadline_on_a_connection_armed_for_a_later_one() -> (
    None
):
    """A kept-alive connection's timer was set for an earlier request's later deadline:
    the next request's earlier deadline still ends it (not 60 s later)."""
    async with fake_pod(ok(b"1"), HANG) as pod:
        client = upstreams(timeout_s=60.0)
        assert await answer(client, pod.url) == (200, b"1")  # its timer: 60 s from now
        client.timeout_s = 0.2  # the next request's deadline comes first
        with pytest.raises(UpstreamTimeoutError):
            await asyncio.wait_for(client.post(POD, pod.url, b"{}"), timeout=30.0)
        assert pod.connections == 1
        await client.close()


async def test_a_waiter_woken_then_cancelled_hands_the_connection_on() -> None:
    async with fake_pod(ok(b"1"), ok(b"3")) as pod:
        client = upstreams(max_connections=1)
        held: Reply = await client.post(POD, pod.url, b"{}")
        second = asyncio.create_task(answer(client, pod.url))
        third = asyncio.create_task(answer(client, pod.url))
        for _ in range(20):
            await asyncio.sleep(0)
        assert await held.read() == b"1"
        held.release()  # wakes the second's waiter...
        second.cancel()  # ...which is cancelled before it runs
        assert await third == (200, b"3")
        assert second.cancelled()
        await client.close()


class _HeldClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now


def test_a_waiter_woken_in_the_turn_its_deadline_passes_hands_the_wake_up_on() -> None:
    """A connection given back and the first waiter's deadline in one loop turn: the
    first fails at its deadline, and the wake-up goes to the next waiter, not nowhere."""
    loop = _HeldClockLoop()

    async def scenario() -> None:
        client = upstreams(max_connections=1)
        first = asyncio.create_task(client._released(10.0))
        second = asyncio.create_task(client._released(100.0))
        for _ in range(3):
            await asyncio.sleep(0)
        loop.call_at(9.0, client._wake_one)  # a connection given back at 9 s...
        loop.now = 10.0  # ...seen in the same turn as the first's deadline
        with pytest.raises(PoolFullError):
            await first
        for _ in range(3):
            await asyncio.sleep(0)
        woken = second.done()
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        assert woken, "the wake-up the first waiter could not use was lost"

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()


async def test_an_unread_answer_closes_its_connection_on_release() -> None:
    async with fake_pod(ok(b"unread"), ok(b"fresh")) as pod:
        client = upstreams()
        reply = await client.post(POD, pod.url, b"{}")
        reply.release()
        assert client.open_connections == 0
        assert await answer(client, pod.url) == (200, b"fresh")
        assert pod.connections == 2
        await client.close()


async def test_a_large_body_read_whole_or_chunk_by_chunk_arrives_whole() -> None:
    """Past the high-water mark reading pauses until the chunks are taken; a whole read
    never pauses (it would wait on itself)."""
    big = bytes(range(256)) * 4096  # 1 MiB
    pieces = [big[k : k + 65536] for k in range(0, len(big), 65536)]
    async with fake_pod(ok(big), chunked(pieces)) as pod:
        client = upstreams()
        assert await answer(client, pod.url) == (200, big)
        reply = await client.post(POD, pod.url, b"{}")
        got = bytearray()
        while part := await reply.chunk():
            got += part
            await asyncio.sleep(0)  # a slow consumer: the pod's bytes pile up meanwhile
        reply.release()
        assert bytes(got) == big
        assert pod.connections == 1
        await client.close()


@settings(max_examples=30, deadline=None)
@given(
    events=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=2000), max_size=6),
)
def test_any_chunking_on_the_wire_passes_the_body_through_unchanged(
    events: list[bytes], cuts: list[int]
) -> None:
    """However the pod's bytes are split into sends, the body arrives whole and in order
    (chunked and content-length), and the connection stays usable."""
    wire = chunked(events)
    points = sorted({0, len(wire), *(cut % len(wire) for cut in cuts)})
    pieces = [wire[a:b] for a, b in itertools.pairwise(points) if b > a]

    async def run() -> None:
        async with fake_pod(pieces, ok(b"".join(events))) as pod:
            client = upstreams()
            reply = await client.post(POD, pod.url, b"{}")
            got = []
            while part := await reply.chunk():
                got.append(part)
            reply.release()
            assert b"".join(got) == b"".join(events)
            assert await answer(client, pod.url) == (200, b"".join(events))
            assert pod.connections == 1
            await client.close()

    asyncio.run(run())


@pytest.mark.parametrize("stream", [False, True])
async def test_emulated_vllm_answers_whole_and_streamed(stream: bool) -> None:
    with emulated(1, engine=Engine.VLLM) as pods:
        url = pods.url("pod-0") + "/v1/completions"
        body = b'{"model": "base-model", "prompt": "hi", "max_tokens": 3, "stream": %s}' % (
            b"true" if stream else b"false"
        )
        client = upstreams()
        for _ in range(2):
            reply = await client.post("pod-0", url, body)
            assert reply.status == 200
            if stream:
                text = b""
                while part := await reply.chunk():
                    text += part
                assert text.endswith(b"data: [DONE]\n\n") and text.count(b"data: ") >= 2
            else:
                assert b'"usage"' in await reply.read()
            reply.release()
        assert client.open_connections == 1
        await client.close()
