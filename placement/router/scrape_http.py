"""The router's reads of its pods' state over HTTP: ``/metrics``, ``/health``, ``/v1/models``.

A router scrapes every pod every ``scrape_interval_s`` (0.25 s by default), in each of
its ``--workers`` processes; through httpx (httpcore, anyio, h11) those reads cost
about a seventh of the router's CPU. ``AiohttpScrapes`` makes them on aiohttp, as the
data path does, with a small session of its own: scrapes never wait behind proxied
requests for a pooled connection, and a stalled pod's connection is dropped by its
own timeout. ``HttpxScrapes`` makes the same reads through an ``httpx.AsyncClient`` a
caller gave the router (tests reach in-process emulated pods through one).

Both answer one GET as a ``Fetched`` (status and body) and fail in two ways only: a
read past its timeout raises ``ScrapeTimeoutError``; any other transport failure
(refused, reset, a bad URL) raises ``RetryableEngineError`` naming the pod and the path.
A body is read up to ``max_bytes`` (``MAX_METRICS_BYTES`` unless the caller says, the
engine clients' ``MAX_BODY_BYTES`` for a listing), whatever its Content-Length says (a
Content-Length may lie, a chunked body has none): past it the answer is its first
``max_bytes`` bytes with ``Fetched.cut`` set, the rest left unread (the connection is
closed, not reused). What a cut body means is the caller's: a ``/metrics`` page is read
from its head (``metrics_text.read_vllm_head``), a ``/health`` answer by its status, and
``listing_of`` refuses a cut listing, naming the cap. An error answer is named by
``Fetched.message``: a short one-line excerpt of its body (``http_engine.body_excerpt``:
the engine's message, a proxy's HTML page by its title). ``listing_of`` reads a
``/v1/models`` answer as the engine clients do
(``placement.adapters.http_engine.listing_from_body``).

Must not judge health or touch the ledger: that is ``router.scraping``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx

from placement.adapters.http_engine import MAX_BODY_BYTES, body_excerpt, listing_from_body
from placement.errors import PermanentEngineError, RetryableEngineError
from placement.ports import Registered

#: The most of a ``/metrics`` or ``/health`` answer read (decoded). A vLLM page is tens
#: of KiB, and grows with ``vllm:lora_requests_info``, which keeps a series (about 150
#: bytes) for every mix of adapters the pod ever ran: 8 MiB is some 50,000 of them. A
#: page past it is read from its head, never refused (``router.scraping``).
MAX_METRICS_BYTES = 8 * 1024 * 1024
#: A ``/v1/models`` listing is read with the engine clients' cap: a listing the
#: controller reads must not take the pod out of the router's rotation.
MAX_LISTING_BYTES = MAX_BODY_BYTES


class ScrapeTimeoutError(Exception):
    """A scrape's read did not finish within its timeout."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """One pod's answer to a GET: its status and its body, whole unless ``cut``."""

    status: int
    body: bytes
    #: The body went on past the read's ``max_bytes``: ``body`` is its first
    #: ``max_bytes`` bytes, the rest was not read.
    cut: bool = False

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def message(self) -> str:
        """The human message of an error answer, whichever shape the engine used, as a
        short excerpt on one line (``http_engine.body_excerpt``)."""
        return body_excerpt(self.status, self.body)


class ScrapeHttp(Protocol):
    """What ``PodScraper`` reads pods with."""

    async def get(
        self, url: str, path: str, *, pod: str, timeout_s: float, max_bytes: int = MAX_METRICS_BYTES
    ) -> Fetched:
        """``GET url+path``, its body up to ``max_bytes`` (``MAX_METRICS_BYTES`` unless
        given; past it ``Fetched.cut``); ``ScrapeTimeoutError`` past ``timeout_s``, any
        other transport failure ``RetryableEngineError``, naming ``pod`` and ``path``."""
        ...

    async def close(self) -> None: ...


def _failed(path: str, pod: str, exc: BaseException) -> RetryableEngineError:
    return RetryableEngineError(f"GET {path} failed: {type(exc).__name__}: {exc}", pod=pod)


async def _head(chunks: AsyncIterator[bytes], *, status: int, max_bytes: int) -> Fetched:
    """A body read up to ``max_bytes``: past them, the answer stops being read."""
    kept: list[bytes] = []
    size = 0
    async for chunk in chunks:
        kept.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return Fetched(status, b"".join(kept)[:max_bytes], cut=True)
    return Fetched(status, b"".join(kept))


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

    async def get(
        self,
        url: str,
        path: str,
        *,
        pod: str,
        timeout_s: float,
        max_bytes: int = MAX_METRICS_BYTES,
    ) -> Fetched:
        try:
            async with self._session.get(url + path, timeout=self._timeout(timeout_s)) as answer:
                # Left with the body unread, aiohttp closes the connection.
                return await _head(
                    answer.content.iter_any(), status=answer.status, max_bytes=max_bytes
                )
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

    async def get(
        self,
        url: str,
        path: str,
        *,
        pod: str,
        timeout_s: float,
        max_bytes: int = MAX_METRICS_BYTES,
    ) -> Fetched:
        try:
            async with self._http.stream("GET", url + path, timeout=timeout_s) as answer:
                # Closed with the body unread, httpx drops the connection.
                return await _head(
                    answer.aiter_bytes(), status=answer.status_code, max_bytes=max_bytes
                )
        except httpx.TimeoutException:
            raise ScrapeTimeoutError(f"{pod}: GET {path} took over {timeout_s} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise _failed(path, pod, exc) from None

    async def close(self) -> None:
        """Nothing: the client is its giver's."""


def listing_of(fetched: Fetched, *, pod: str) -> Registered:
    """A pod's ``/v1/models`` answer: its adapters (with their roots) and base model. A
    cut listing is refused: a listing read in part would unload what it leaves out."""
    if fetched.cut:
        raise PermanentEngineError(
            f"GET /v1/models answered {fetched.status} with a body over "
            f"{len(fetched.body)} bytes: not read past them",
            pod=pod,
            status=fetched.status,
        )
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
