"""The router's front door: what a request must be before anything else looks at it.

In order, each refusal a ``Refusal`` (status, message, the field, the metric reason):

1. the body: at most ``max_body_bytes``; a ``Content-Length`` over it is 413 before a
   byte is read, and a body without one is read only up to the limit (a 300 MB body
   is never buffered);
2. JSON: an object, nested at most ``max_json_depth`` deep (a body nested 100,000
   deep is 400, not the parser's ``RecursionError``);
3. ``model``: a string, and a name an adapter can have (a DNS label, as the catalog's
   names are) or a served base model's name; anything else (``"\\ud800"``, an empty
   name, a path) is 400 and reaches no metric label and no log row;
4. ``user``: if given, a string of Unicode text (a lone surrogate cannot be written
   anywhere), kept to its first ``MAX_TENANT_CHARS`` characters; so is ``X-Tenant``.

Pure: bytes and headers in, an ``Exchange`` filled in or a refusal out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Collection, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from placement.router.forward import Exchange

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

#: An adapter's name as the catalog has it: a DNS label (the whole string: ``$`` would
#: let a trailing newline through).
_ADAPTER_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
#: Tenants longer than this are cut in the log (the OpenAI ``user`` is an id).
MAX_TENANT_CHARS = 256
_PASSED_HEADERS = (b"authorization",)


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str
    #: The request field at fault (OpenAI's ``param``), if one is.
    param: str | None
    #: The ``reason`` label of ``lorafleet_router_refused_requests_total``.
    reason: str


def body_too_large(max_bytes: int) -> Refusal:
    message = f"the request body is over the router's limit of {max_bytes} bytes"
    return Refusal(413, message, None, "body_too_large")


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length, if given as ASCII digits (anything else is the server's)."""
    for name, value in headers:
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


async def read_body(
    receive: Receive, headers: Iterable[tuple[bytes, bytes]], *, max_bytes: int
) -> bytes | Refusal:
    """The whole body, or a 413 once it is known to be over ``max_bytes``: from the
    Content-Length, else as soon as the bytes read pass it. ConnectionResetError when
    the client goes away first."""
    length = declared_length(headers)
    if length is not None and length > max_bytes:
        return body_too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            return body_too_large(max_bytes)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def too_deep(payload: object, *, max_depth: int) -> bool:
    """Whether ``payload`` nests containers deeper than ``max_depth`` (iteratively)."""
    stack: list[tuple[object, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Iterable[object] = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


#: ``json.loads``' own decoder (its default arguments), called without its wrapper.
_DECODE = json.JSONDecoder().decode


def _loads(body: bytes) -> Any:
    """``json.loads(body)``, the usual body (a UTF-8 object) without its encoding
    detection, a Python function of a few microseconds per request. A body that opens
    with ``{`` and a non-zero byte is what ``json.detect_encoding`` calls UTF-8, and
    ``json.loads`` decodes it as here (``surrogatepass``); any other goes to it."""
    if body[:1] == b"{" and body[1:2] not in (b"", b"\x00"):
        return _DECODE(body.decode("utf-8", "surrogatepass"))
    return json.loads(body)


def _nesting_bound(body: bytes) -> int:
    """An upper bound of the body's JSON nesting: its count of opening brackets."""
    return body.count(b"[") + body.count(b"{")


def is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text that can be written (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(value: str) -> str:
    """``value`` for an error message: escaped, at most 64 characters."""
    shown = json.dumps(value[:64])
    return shown if len(value) <= 64 else shown[:-1] + '..."'


def parse_request(
    exchange: Exchange,
    headers: Iterable[tuple[bytes, bytes]],
    *,
    max_depth: int,
    base_models: Collection[str],
) -> Refusal | None:
    """Read ``exchange.body`` into the exchange; a refusal if it is not a usable request."""
    try:
        payload = _loads(exchange.body)
    except (ValueError, RecursionError):
        # RecursionError: nested deeper than the parser goes (tens of thousands).
        if _nesting_bound(exchange.body) > max_depth:
            return Refusal(400, _deep_message(max_depth), None, "too_deep")
        return Refusal(400, "the request body is not valid JSON", None, "not_json")
    body = exchange.body  # a body shorter than the limit cannot nest deeper than it
    if (
        len(body) > max_depth
        and _nesting_bound(body) > max_depth
        and too_deep(payload, max_depth=max_depth)
    ):
        return Refusal(400, _deep_message(max_depth), None, "too_deep")
    model = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(payload, dict) or not isinstance(model, str):
        message = "the request needs a string field 'model' (the adapter's name)"
        return Refusal(400, message, "model", "bad_model")
    if model not in base_models and _ADAPTER_NAME.fullmatch(model) is None:
        message = (
            f"model {_shown(model)} is not an adapter name (lower-case letters, digits "
            "and '-', at most 63) nor a served base model"
        )
        return Refusal(400, message, "model", "bad_model")
    user = payload.get("user")
    if user is not None and not (isinstance(user, str) and is_text(user)):
        return Refusal(400, "'user' must be a string of Unicode text", "user", "bad_user")
    exchange.payload = payload
    exchange.model = model
    exchange.stream = bool(payload.get("stream"))
    exchange.tenant = user[:MAX_TENANT_CHARS] if isinstance(user, str) else None
    for name, value in headers:
        if name == b"x-tenant":
            exchange.tenant = value.decode("latin-1")[:MAX_TENANT_CHARS]
        elif name in _PASSED_HEADERS:
            exchange.auth = value
    return None


def _deep_message(max_depth: int) -> str:
    return f"the request body nests JSON deeper than {max_depth} levels"
