"""Router workers keep their client connections even: a worker holding more than one
over its share answers its next responses with ``connection: close``, so the client
reconnects and the kernel hands the new connection to any worker (``router.workers``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

from placement.router.connection_balance import BalancedApp, ConnectionCounts, over_share

Message = MutableMapping[str, Any]


@pytest.mark.parametrize(
    ("connections", "worker", "closing"),
    [
        ((21, 11), 0, 5),
        ((21, 11), 1, 0),
        ((17, 15), 0, 0),
        ((18, 14), 0, 2),
        ((0, 0), 0, 0),
        ((4, 0), 0, 2),
        ((12, 10, 10), 0, 0),
        ((20, 6, 6), 0, 9),
    ],
    ids=[
        "21-of-32",
        "the-lighter",
        "one-over",
        "two-over",
        "none",
        "four-alone",
        "three-workers-even",
        "three-workers-one-heavy",
    ],
)
def test_a_worker_closes_what_it_holds_past_its_share(
    connections: tuple[int, ...], worker: int, closing: int
) -> None:
    assert over_share(connections, worker) == closing


async def _answer(scope: Message, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"1")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _heads(app: BalancedApp, requests: int) -> Iterator[list[tuple[bytes, bytes]]]:
    async def one() -> list[tuple[bytes, bytes]]:
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        await app({"type": "http", "path": "/v1/completions"}, receive, send)
        assert sent[1] == {"type": "http.response.body", "body": b"ok"}
        return list(sent[0]["headers"])

    for _ in range(requests):
        yield asyncio.run(one())


def test_a_worker_over_its_share_closes_that_many_answered_connections() -> None:
    counts = ConnectionCounts(2)
    # a bare ASGI answer stands in for the RouterApp that BalancedApp wraps
    heavy = BalancedApp(_answer, counts, worker=0)  # type: ignore[arg-type]
    light = BalancedApp(_answer, counts, worker=1)  # type: ignore[arg-type]
    light.rebalance(11)
    heavy.rebalance(21)
    assert counts.each() == (21, 11)
    heads = list(_heads(heavy, 7))
    closed = [(b"connection", b"close") in head for head in heads]
    assert closed == [True] * 5 + [False] * 2
    assert all((b"x", b"1") in head for head in heads)
    light.rebalance(11)
    assert not any((b"connection", b"close") in head for head in _heads(light, 3))


def test_the_counts_are_shared_with_a_forked_worker() -> None:
    counts = ConnectionCounts(2)
    pid = os.fork()
    if pid == 0:  # the worker: writes its count and exits
        counts.record(1, 9)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert counts.each() == (0, 9)
