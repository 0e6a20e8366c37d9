"""Envoy ext_proc's messages translated: one ``Process`` stream's messages in, the
endpoint picker's answers out, whichever server carries them.

An Envoy-based gateway (Envoy Gateway, kgateway, Istio, GKE) routing to an
InferencePool asks an endpoint picker (EPP) which pod serves each request, over Envoy's
external processing protocol: one bidirectional ``Process`` stream per HTTP request
(``envoy.service.ext_proc.v3.ExternalProcessor``). The messages are Envoy's published
protos (the ``xds-protos`` package). ``_Stream`` is one stream: it reads each message,
asks ``router.endpoint_picking`` for the decision and builds the responses; the server
that carries them (``router.picker_grpc``: grpc.aio's ``ExternalProcessor``, or the
picker's own HTTP/2 one through ``router.picker_calls``) only reads and writes them.

The protocol, as the Gateway API Inference Extension defines it
(kubernetes-sigs/gateway-api-inference-extension, docs/proposals/
004-endpoint-picker-protocol/README.md) and its reference EPP does it
(pkg/epp/handlers/server.go and request.go):

- the chosen pod goes back as ``host:port`` both in the request header
  ``x-gateway-destination-endpoint`` and in the response's dynamic metadata
  ``{"envoy.lb": {"x-gateway-destination-endpoint": ...}}``, the same value in both,
  with ``clear_route_cache`` (request.go, ``populateRequestHeaderResponse``); the value
  may list fallbacks after a comma (protocol v0.4.0), which the gateway tries in order
  when its retry policy retries: lorafleet adds at most one, a pod that already holds
  the adapter. The header is set with OVERWRITE_IF_EXISTS_OR_ADD, so a client cannot
  smuggle its own;
- the gateway may restrict the pick to ``filter_metadata["envoy.lb.subset_hint"]
  ["x-gateway-destination-endpoint-subset"]`` (a list of ``host:port``); an empty or
  ineligible subset is a 503;
- no pod: an ``ImmediateResponse`` 503 (with Retry-After, as the proxy answers);
  a bad request: 400 naming the problem (server.go, ``BuildErrResponse``);
- the gateway reports the endpoint that served in the response's
  ``metadata_context["envoy.lb"]["x-gateway-destination-endpoint-served"]``; one other
  than the chosen pod means the gateway fell back because that pod failed.

Processing modes. GIE gateways stream bodies in ``FULL_DUPLEX_STREAMED`` mode: the
picker holds its answer to the headers until the body's last chunk, then sends the
headers' response (the endpoint) and the whole body back as one streamed chunk, and it
echoes response body chunks as they come (server.go, ``updateStateAndSendIfNeeded``:
header before body, in order). With any other body mode (``protocol_config`` says
which; Envoy sends it on the first message) the headers are answered at once with
CONTINUE and the endpoint rides on the body's response, where buffered bodies allow
header mutations. A request whose headers end the stream (a GET) is answered on its
headers. Response headers, bodies and trailers are passed through unchanged and read for
the request log (status, time to first byte, tokens). A client retry is a new stream and
a new pick; a pod that failed is out of the rotation (the scrape's verdict, or the
gateway's fallback) and is not picked.

Must not decide anything (``router.endpoint_picking`` does) nor serve gRPC
(``router.picker_grpc``, ``router.picker_h2``).
"""

from __future__ import annotations

import json
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2

from placement.router.core import Router
from placement.router.endpoint_picking import GatewayRequest, Picked, Refused

#: The header and the metadata key the gateway reads the chosen endpoints from.
DESTINATION = "x-gateway-destination-endpoint"
#: The metadata namespace of the destination (and of the served endpoint).
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_CONTINUE_HEADERS = ext_proc.HeadersResponse()
_CONTINUE_BODY = ext_proc.BodyResponse()
# Answers that never change, built once (gRPC only serializes what it is given).
_REQUEST_TRAILERS = ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
_RESPONSE_TRAILERS = ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())
_RESPONSE_HEADERS_CONTINUE = ext_proc.ProcessingResponse(response_headers=_CONTINUE_HEADERS)
_REQUEST_HEADERS_CONTINUE = ext_proc.ProcessingResponse(request_headers=_CONTINUE_HEADERS)
_REQUEST_BODY_CONTINUE = ext_proc.ProcessingResponse(request_body=_CONTINUE_BODY)
_RESPONSE_BODY_CONTINUE = ext_proc.ProcessingResponse(response_body=_CONTINUE_BODY)


def _header_value(header: Any) -> bytes:
    """Envoy sends ``raw_value`` (bytes) since 1.27, ``value`` before."""
    raw: bytes = header.raw_value
    return raw if raw else str(header.value).encode("latin-1", "replace")


def _set_header(key: str, value: bytes) -> Any:
    header = base_pb2.HeaderValue(key=key, raw_value=value)
    return base_pb2.HeaderValueOption(header=header, append_action=_OVERWRITE)


def _metadata_value(message: Any, namespace: str, key: str) -> Any | None:
    """``message.metadata_context.filter_metadata[namespace][key]``, if there."""
    if not message.HasField("metadata_context"):
        return None
    space = message.metadata_context.filter_metadata.get(namespace)
    return None if space is None else space.fields.get(key)


def _subset(message: Any) -> frozenset[str] | None:
    value = _metadata_value(message, SUBSET_NAMESPACE, SUBSET_KEY)
    if value is None:
        return None
    if value.WhichOneof("kind") == "list_value":
        return frozenset(item.string_value for item in value.list_value.values)
    return frozenset(part.strip() for part in value.string_value.split(",") if part.strip())


class RoutedAnswers:
    """The responses naming endpoints, built once per list of endpoints: without a new
    body they are the same message for every request sent there (gRPC only serializes
    them), so most requests reuse one. Bounded: cleared when it holds ``limit``."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._built: dict[tuple[tuple[str, ...], bool], Any] = {}

    def answer(self, picked: Picked, *, on_body: bool) -> Any:
        if picked.body is not None:
            return _routed(picked, on_body=on_body)
        key = (picked.endpoints, on_body)
        built = self._built.get(key)
        if built is None:
            if len(self._built) >= self.limit:
                self._built.clear()
            built = self._built[key] = _routed(picked, on_body=on_body)
        return built


def _routed(picked: Picked, *, on_body: bool) -> Any:
    """The response carrying the endpoints: the headers' (or, not in full duplex, the
    buffered body's, which may also replace the body). Built by field paths: nested
    constructors copy each sub-message, several times slower."""
    value = ",".join(picked.endpoints)
    response = ext_proc.ProcessingResponse()
    answer = response.request_body if on_body else response.request_headers
    common = answer.response
    common.clear_route_cache = True
    headers = common.header_mutation.set_headers
    _add_header(headers, DESTINATION, value.encode())
    if picked.body is not None:
        _add_header(headers, "content-length", str(len(picked.body)).encode())
        if on_body:
            common.body_mutation.body = picked.body
    response.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields[
        DESTINATION
    ].string_value = value
    return response


def _add_header(headers: Any, key: str, value: bytes) -> None:
    option = headers.add()
    option.header.key = key
    option.header.raw_value = value
    option.append_action = _OVERWRITE


def _streamed_body(body: bytes, *, end: bool, request: bool) -> Any:
    """A body chunk sent back in full-duplex mode (the gateway sends only what we do)."""
    response = ext_proc.ProcessingResponse()
    answer = response.request_body if request else response.response_body
    streamed = answer.response.body_mutation.streamed_response
    streamed.body = body
    streamed.end_of_stream = end
    return response


def immediate(refused: Refused) -> Any:
    """The gateway answers the client itself: the proxy's OpenAI error, as JSON."""
    error = {
        "message": refused.message,
        "type": refused.kind,
        "param": refused.param,
        "code": refused.status,
    }
    headers = [_set_header("content-type", b"application/json")]
    if refused.retry_after_s is not None:
        headers.append(_set_header("retry-after", str(refused.retry_after_s).encode()))
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=refused.status),
            headers=ext_proc.HeaderMutation(set_headers=headers),
            body=json.dumps({"error": error}).encode(),
            details=f"lorafleet: {refused.message}",
        )
    )


class _Stream:
    """One ``Process`` stream: one HTTP request, its body and its answer."""

    def __init__(self, router: Router, routes: RoutedAnswers) -> None:
        self.router = router
        self.routes = routes
        self.request: GatewayRequest | None = None
        self.duplex = True
        self.chunks: list[bytes] = []
        self.size_bytes = 0
        self.subset: frozenset[str] | None = None
        #: The body ended and was decided on; ``done``: the stream is answered for good.
        self.decided = False
        self.done = False

    def note(self, message: Any) -> None:
        """What any message may carry: the processing mode, the subset hint."""
        if message.HasField("protocol_config"):
            mode = message.protocol_config.request_body_mode
            self.duplex = mode == _FULL_DUPLEX
        subset = _subset(message)
        if subset is not None:
            self.subset = subset

    def answer(self, message: Any) -> list[Any]:
        """The responses to one message but a request body's, in the gateway's order."""
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._request_headers(message.request_headers)
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "request_trailers":
            return [_REQUEST_TRAILERS]
        if kind == "response_trailers":
            return [_RESPONSE_TRAILERS]
        return []  # request_body: ``body`` answers it, after the decision

    def _request_headers(self, headers: Any) -> list[Any]:
        if self.request is not None:
            raise ValueError("request headers twice in one stream")
        pairs: list[tuple[bytes, bytes]] = []
        path: bytes | None = None
        length: bytes | None = None
        for header in headers.headers.headers:  # one pass: the pairs, the path, the size
            key = header.key.lower().encode("latin-1", "replace")
            value = header.raw_value or _header_value(header)
            if key == b":path" and path is None:
                path = value
            elif key == b"content-length" and length is None:
                length = value
            pairs.append((key, value))
        target = (path or b"/").decode("latin-1").split("?", 1)[0]
        self.request = GatewayRequest(self.router, pairs, path=target, subset=self.subset)
        length = length or b""
        refused = self.request.too_large(int(length)) if length.isdigit() else None
        if refused is not None:
            return self._end(immediate(refused))
        if headers.end_of_stream:
            self.decided = True
            return self._decided(self.request.decide_without_body(), on_body=False)
        if self.duplex:
            return []  # the answer waits for the body (the model is in it)
        return [_REQUEST_HEADERS_CONTINUE]

    async def body(self, chunk: Any) -> list[Any]:
        """A request body chunk; the decision once the body is whole."""
        request = self.request
        if request is None:
            raise ValueError("a request body before its headers")
        if self.decided:
            raise ValueError("a request body after its end")
        self.size_bytes += len(chunk.body)
        refused = request.too_large(self.size_bytes)
        if refused is not None:
            return self._end(immediate(refused))
        self.chunks.append(chunk.body)
        if not chunk.end_of_stream:
            # Not in full duplex, each chunk the gateway streams wants its answer.
            return [] if self.duplex else [_REQUEST_BODY_CONTINUE]
        body = b"".join(self.chunks)
        self.chunks = []
        self.decided = True
        if request.subset is None:
            request.subset = self.subset
        decision = await request.decide(body)
        responses = self._decided(decision, on_body=not self.duplex)
        if self.duplex and isinstance(decision, Picked):
            sent = decision.body if decision.body is not None else body
            responses.append(_streamed_body(sent, end=True, request=True))
        return responses

    def _decided(self, decision: Picked | Refused, *, on_body: bool) -> list[Any]:
        if isinstance(decision, Refused):
            return self._end(immediate(decision))
        return [self.routes.answer(decision, on_body=on_body)]

    def _end(self, response: Any) -> list[Any]:
        self.done = True  # an immediate response ends the request
        return [response]

    def _response_headers(self, message: Any) -> list[Any]:
        request = self.request
        if request is not None:
            served = _metadata_value(message, LB_NAMESPACE, SERVED_KEY)
            if served is not None and served.string_value:
                request.served(served.string_value.split(",", 1)[0].strip())
            pairs = {
                h.key.lower(): _header_value(h) for h in message.response_headers.headers.headers
            }
            status = pairs.get(":status", b"")
            content_type = pairs.get("content-type", b"").decode("latin-1")
            if status.isdigit():
                request.response_status(int(status), content_type=content_type)
            if message.response_headers.end_of_stream:
                request.response_bytes(b"", end=True)
        return [_RESPONSE_HEADERS_CONTINUE]

    def _response_body(self, chunk: Any) -> list[Any]:
        if self.request is not None:
            self.request.response_bytes(chunk.body, end=chunk.end_of_stream)
        if self.duplex:
            return [_streamed_body(chunk.body, end=chunk.end_of_stream, request=False)]
        return [_RESPONSE_BODY_CONTINUE]

    def finish(self) -> None:
        if self.request is not None:
            self.request.finish()
