"""What the vLLM and SGLang clients share: one HTTP call with its failures mapped.

The only network code of the engine clients. Every transport failure (refused
connection, reset, timeout) becomes ``RetryableEngineError``; a 5xx (or 429) answer
too, unless the caller asks to read it (SGLang's dp_size 500 is permanent); the
engine-specific modules decide what each 4xx means. Error bodies come nested
(``{"error": {"message", ...}}``, current vLLM), flat (``{"message", ...}``, older
vLLM and SGLang's OpenAI routes), as SGLang's ``{"error_message"}`` or as plain text:
``error_text`` reads them all. ``/v1/models`` and ``/health`` look alike on both
engines, so they live here.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import httpx

from placement.domain import AdapterId, PodId
from placement.errors import PermanentEngineError, RetryableEngineError
from placement.ports import Registered

DEFAULT_TIMEOUT_S = 30.0


def error_text(response: httpx.Response) -> str:
    """The human message of an error body, whichever shape the engine used."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text.strip()
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict) and isinstance(nested.get("message"), str):
            return str(nested["message"])
        for key in ("error_message", "message", "detail"):
            if isinstance(body.get(key), str):
                return str(body[key])
    if isinstance(body, str):
        return body
    return response.text.strip()


def is_route_missing(response: httpx.Response) -> bool:
    """FastAPI's own 404 for a route that is not mounted: ``{"detail":"Not Found"}``."""
    if response.status_code != 404:
        return False
    try:
        return bool(response.json() == {"detail": "Not Found"})
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


class HttpEngine:
    """Base of the engine clients: one pod, one (possibly shared) ``httpx.AsyncClient``.

    URLs are absolute, so one client with one connection pool (or one test transport)
    can serve a whole fleet; a client made here is owned and closed by ``aclose``.
    """

    def __init__(
        self,
        pod: PodId,
        url: str,
        *,
        served_model_name: str | None = None,
        http: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._pod = pod
        self._url = url.rstrip("/")
        self._served_model_name = served_model_name
        self._owns_http = http is None
        self._http = http if http is not None else httpx.AsyncClient()
        self._timeout = httpx.Timeout(timeout_s)

    @property
    def pod(self) -> PodId:
        return self._pod

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    def retryable(self, message: str, *, status: int | None = None) -> RetryableEngineError:
        return RetryableEngineError(message, pod=self._pod, status=status)

    def permanent(self, message: str, *, status: int | None = None) -> PermanentEngineError:
        return PermanentEngineError(message, pod=self._pod, status=status)

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        answer_5xx: bool = False,
    ) -> httpx.Response:
        """Send one request; transport failures, and 5xx/429 unless ``answer_5xx`` (the
        caller reads them itself), raise RetryableEngineError."""
        try:
            response = await self._http.request(
                method, self._url + path, json=body, timeout=self._timeout
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise self.permanent(f"bad pod url {self._url!r}: {exc}") from None
        except httpx.TimeoutException:
            raise self.retryable(f"{method} {path} timed out") from None
        except httpx.TransportError as exc:
            raise self.retryable(f"{method} {path} failed: {type(exc).__name__}: {exc}") from None
        if not answer_5xx and (response.status_code >= 500 or response.status_code == 429):
            raise self.retryable(
                f"{method} {path} answered {response.status_code}: {error_text(response)}",
                status=response.status_code,
            )
        return response

    def unexpected(self, path: str, response: httpx.Response) -> PermanentEngineError:
        return self.permanent(
            f"{path} answered {response.status_code}: {error_text(response)}",
            status=response.status_code,
        )

    async def registered(self) -> Registered:
        response = await self.call("GET", "/v1/models")
        if response.status_code != 200:
            raise self.unexpected("/v1/models", response)
        try:
            cards = response.json()["data"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise self.permanent("/v1/models answered a body that is not a model list") from None
        return registered_from_cards(cards)

    async def health(self) -> bool:
        try:
            response = await self.call("GET", "/health")
        except RetryableEngineError:
            return False
        return response.status_code == 200

    async def served_model_name(self) -> str:
        """The base model's served name: given, or read once from ``/v1/models``."""
        if self._served_model_name is None:
            listed = await self.registered()
            if listed.base_model is None:
                raise self.permanent("/v1/models lists no base model to name in requests")
            self._served_model_name = listed.base_model
        return self._served_model_name

    async def scrape(self) -> str:
        response = await self.call("GET", "/metrics")
        if response.status_code != 200:
            raise self.unexpected("/metrics", response)
        return response.text


def registered_from_cards(cards: object) -> Registered:
    """The adapters (with their roots) and the base model of a ``/v1/models`` answer's
    ``data``: a card with a ``parent`` is an adapter of that base; the first card
    without one is the base. Cards that are not objects with a string ``id`` are skipped."""
    adapters: dict[AdapterId, str] = {}
    base: str | None = None
    for card in cards if isinstance(cards, list) else []:
        if not isinstance(card, dict) or not isinstance(card.get("id"), str):
            continue
        if card.get("parent"):
            adapters[AdapterId(card["id"])] = str(card.get("root") or "")
            base = base or str(card["parent"])
        elif base is None:
            base = card["id"]
    return Registered(adapters=MappingProxyType(adapters), base_model=base)
