"""The webhook's checks at the edge, cheapest first, and the bounded state they keep.

Owns the signature (``sign``, the two headers), the timestamp window, the body limit's
arithmetic, the per-source and overall token buckets, the source key a trusted proxy
gives, and the event ids seen recently; each check answers None or a ``Refusal``
(status, outcome, message). It must not parse an event or name a route:
``webhook_schema`` parses, ``webhook`` runs the checks in order and answers.

Signing (the sender's side): ``X-Lorafleet-Timestamp`` is the Unix time in seconds,
``X-Lorafleet-Signature`` is ``sha256=`` and the hex HMAC-SHA256, keyed with the
shared secret, of the timestamp, a ``.``, and the raw body.

Every structure here is bounded: the token buckets (``max_sources``), the remembered
event ids (``max_ids``, and only for twice the timestamp window). A flood costs CPU,
not memory. Every header value is parsed strictly, as ASCII.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fastapi.responses import JSONResponse

from placement.controller.config import secret_problem
from placement.settings import ControllerSettings

TIMESTAMP_HEADER = "X-Lorafleet-Timestamp"
SIGNATURE_HEADER = "X-Lorafleet-Signature"
_SIGNATURE = re.compile(r"^sha256=([0-9a-f]{64})$")
_DIGITS = re.compile(r"[0-9]{1,12}", re.ASCII)
#: A source key taken from a header: an address, or at worst an opaque short token.
_SOURCE_KEY = re.compile(r"[0-9A-Za-z.:\[\]_-]{1,64}", re.ASCII)


class TokenBuckets:
    """Per-source token buckets, the least recently seen source forgotten past ``max_sources``.

    A clock that jumps back refills nothing; one that jumps forward refills at most a
    full bucket.
    """

    def __init__(self, *, rate_per_s: float, burst: float, max_sources: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_sources = max_sources
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, source: str, *, now_s: float) -> bool:
        tokens, last_s = self._buckets.pop(source, (self.burst, now_s))
        tokens = min(self.burst, tokens + max(0.0, now_s - last_s) * self.rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if allowed else tokens, max(last_s, now_s))
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return allowed


class SeenIds:
    """Event ids accepted recently: at most ``max_ids``, each kept ``ttl_s``."""

    def __init__(self, *, max_ids: int, ttl_s: float) -> None:
        self.max_ids = max_ids
        self.ttl_s = ttl_s
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._seen

    def add(self, event_id: str, *, now_s: float) -> None:
        self._seen[event_id] = now_s
        self._seen.move_to_end(event_id)
        while self._seen and (
            len(self._seen) > self.max_ids or now_s - next(iter(self._seen.values())) > self.ttl_s
        ):
            self._seen.popitem(last=False)


def sign(secret: bytes, *, timestamp: str, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


@dataclass(frozen=True, kw_only=True)
class Refusal:
    status: int
    outcome: str
    message: str
    retry_after_s: int | None = None

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None
        return JSONResponse({"detail": self.message}, status_code=self.status, headers=headers)


class WebhookGate:
    """The checks in order, each cheaper than the next; keeps the bounded state."""

    def __init__(
        self, *, secret: bytes, settings: ControllerSettings, clock: Callable[[], float]
    ) -> None:
        problem = secret_problem(secret)
        if problem is not None:
            raise ValueError(problem)
        self._secret = secret
        self._settings = settings
        self._clock = clock
        self.per_source = TokenBuckets(
            rate_per_s=settings.webhook_rate_per_s,
            burst=settings.webhook_burst,
            max_sources=settings.webhook_max_sources,
        )
        self.overall = TokenBuckets(
            rate_per_s=settings.webhook_total_rate_per_s,
            burst=settings.webhook_total_rate_per_s,
            max_sources=1,
        )
        self.seen = SeenIds(max_ids=settings.webhook_max_ids, ttl_s=2 * settings.webhook_max_skew_s)

    def source_of(self, peer: str | None, headers: Mapping[str, str]) -> str:
        """The key of the sender's token bucket: the address the trusted proxy put in
        ``webhook_source_header`` (``webhook_trusted_hops`` from the right), else the
        client address. A header that is absent or malformed falls back to the peer."""
        fallback = peer or "unknown"
        name = self._settings.webhook_source_header
        if name is None:
            return fallback
        entries = [part.strip() for part in headers.get(name, "").split(",")]
        hops = self._settings.webhook_trusted_hops
        if len(entries) < hops:
            return fallback
        candidate = entries[-hops]
        return candidate if _SOURCE_KEY.fullmatch(candidate) else fallback

    def too_large_declared(self, declared_length: str | None) -> Refusal | None:
        """413 before reading a byte, when Content-Length says so (or is not a number)."""
        if declared_length is not None and (
            not _DIGITS.fullmatch(declared_length) or int(declared_length) > self.max_body_bytes
        ):
            return self.too_large()
        return None

    def rate_limited(self, source: str) -> Refusal | None:
        """429 when this source, or every source together, is over its rate."""
        now_s = self._clock()
        if not self.per_source.take(source, now_s=now_s) or not self.overall.take("*", now_s=now_s):
            return Refusal(
                status=429, outcome="rate_limited", message="rate limit exceeded", retry_after_s=1
            )
        return None

    @property
    def max_body_bytes(self) -> int:
        return self._settings.webhook_max_body_bytes

    def too_large(self) -> Refusal:
        return Refusal(
            status=413,
            outcome="too_large",
            message=f"body larger than {self.max_body_bytes} bytes",
        )

    def authenticate(
        self, timestamp: str | None, signature: str | None, body: bytes
    ) -> Refusal | None:
        def refuse(message: str) -> Refusal:
            return Refusal(status=401, outcome="unauthorized", message=message)

        if not timestamp or not signature:
            return refuse(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
        if not _DIGITS.fullmatch(timestamp):
            return refuse(f"{TIMESTAMP_HEADER} must be Unix seconds (ASCII digits)")
        skew_s = abs(self._clock() - int(timestamp))
        if skew_s > self._settings.webhook_max_skew_s:
            return refuse(
                f"timestamp is {skew_s:.0f} s away from now "
                f"(at most {self._settings.webhook_max_skew_s} s allowed)"
            )
        match = _SIGNATURE.match(signature)
        expected = sign(self._secret, timestamp=timestamp, body=body)
        if match is None or not hmac.compare_digest(expected.encode(), signature.encode()):
            return refuse("signature does not match")
        return None

    def remember(self, event_id: str) -> None:
        self.seen.add(event_id, now_s=self._clock())
