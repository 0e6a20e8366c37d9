"""The router's reads of its pods' state over HTTP: ``/metrics``, ``/health``, ``/v1/models``.

A router scrapes every pod every ``scrape_interval_s`` (0.25 s by default), in each of
its ``--workers`` processes; through httpx (httpcore, anyio, h11) those reads cost
about a seventh of the router's CPU. ``AiohttpScrapes`` makes them on aiohttp, as the
data path does, with a small session of its own: scrapes never wait behind proxied
requests for a pooled connection, and a stalled pod's connection is dropped by its
own timeout. ``HttpxScrapes`` makes the same reads through an ``httpx.AsyncClient`` a
caller gave the router (tests reach in-process emulated pods through one).

Both answer one GET as a ``Fetched`` (status and body) and fail in two ways only: a
read past its timeout raises ``ScrapeTimeoutError``; any other transport failure (refused,
reset, a bad URL) raises ``RetryableEngineError`` naming the pod and the path.
``listing_of`` reads a ``/v1/models`` answer as the engine clients do
(``placement.adapters.http_engine.listing_from_body``).

Must not judge health or touch the ledger: that is ``router.scraping``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx

from placement.adapters.http_engine import error_text, listing_from_body
from placement.errors import PermanentEngineError, RetryableEngineError
from placement.ports import Registered


class ScrapeTimeoutError(Exception):
    """A scrape's read did not finish within its timeout."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """One pod's answer to a GET: its status and its whole body."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def message(self) -> str:
        """The human message of an error answer, whichever shape the engine used."""
        return error_text(httpx.Response(self.status, content=self.body))


class ScrapeHttp(Protocol):
    """What ``PodScraper`` reads pods with."""

    async def get(self, url: str, path: str, *, pod: str, timeout_s: float) -> Fetched:
        """``GET url+path``, whole; ``ScrapeTimeoutError`` past ``timeout_s``, any other
        transport failure ``RetryableEngineError`` naming ``pod`` and ``path``."""
        ...

    async def close(self) -> None: ...


def _failed(path: str, pod: str, exc: BaseException) -> RetryableEngineError:
    return RetryableEngineError(f"GET {path} failed: {type(exc).__name__}: {exc}", pod=pod)


class AiohttpScrapes:
    """Scrapes on an aiohttp session of their own, opened here (on a running loop)."""

    def __init__(self, *, per_pod: int = 2) -> None:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=per_pod, ttl_dns_cache=300, keepalive_timeout=75.0
        )
        # No User-Agent, no Accept-Encoding: nothing for the pod to compress.
        self._session = aiohttp.ClientSession(
            connector=connector, skip_auto_headers=("User-Agent", "Accept-Encoding")
        )
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = self._timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
        return timeout

    async def get(self, url: str, path: str, *, pod: str, timeout_s: float) -> Fetched:
        try:
            async with self._session.get(url + path, timeout=self._timeout(timeout_s)) as answer:
                return Fetched(answer.status, await answer.read())
        except TimeoutError:  # aiohttp's own timeouts are TimeoutErrors too
            raise ScrapeTimeoutError(f"{pod}: GET {path} took over {timeout_s} s") from None
        except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a URL yarl refuses
            raise _failed(path, pod, exc) from None

    async def close(self) -> None:
        await self._session.close()

    @property
    def closed(self) -> bool:
        return self._session.closed


class HttpxScrapes:
    """Scrapes through an ``httpx.AsyncClient`` the caller owns (and closes)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def get(self, url: str, path: str, *, pod: str, timeout_s: float) -> Fetched:
        try:
            answer = await self._http.get(url + path, timeout=timeout_s)
        except httpx.TimeoutException:
            raise ScrapeTimeoutError(f"{pod}: GET {path} took over {timeout_s} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise _failed(path, pod, exc) from None
        return Fetched(answer.status_code, answer.content)

    async def close(self) -> None:
        """Nothing: the client is its giver's."""


def listing_of(fetched: Fetched, *, pod: str) -> Registered:
    """A pod's ``/v1/models`` answer: its adapters (with their roots) and base model."""
    if fetched.status >= 500 or fetched.status == 429:
        raise RetryableEngineError(
            f"GET /v1/models answered {fetched.status}: {fetched.message()}",
            pod=pod,
            status=fetched.status,
        )
    if fetched.status != 200:
        raise PermanentEngineError(
            f"/v1/models answered {fetched.status}: {fetched.message()}",
            pod=pod,
            status=fetched.status,
        )
    return listing_from_body(fetched.body, pod=pod)
