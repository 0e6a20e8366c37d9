"""``lorafleet router --endpoint-picker``: the router as a Gateway API endpoint picker.

An Envoy-based gateway asks an endpoint picker (EPP) which pod serves each request, over
Envoy's external processing protocol (one ``Process`` stream per HTTP request), served
here on the router's own event loop, so the picker shares the proxy's ``Router``:
topology, ledger, coalesced loads, metrics, request log. This module holds the server:
``EndpointPickerServer`` and its transports, the picker's own HTTP/2 server by default
(``router.picker_h2`` with ``router.picker_calls``: grpc.aio's C-core cost about the
whole latency budget per stream), or ``grpc.aio`` (``transport="grpc.aio"``, this
module's ``ExternalProcessor``), with ``grpc.health.v1`` (``router.picker_health``) on
the same port. The messages are translated by ``router.picker_messages`` (the protocol
is described there); the decisions are ``router.endpoint_picking``'s.

Must not decide anything nor build ext_proc's messages: it only carries them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from placement.router.core import Router
from placement.router.picker_health import add_health
from placement.router.picker_messages import RoutedAnswers, _Stream

#: ``RoutedAnswers`` and ``_Stream`` live in ``router.picker_messages``; the benches
#: import them from here too.
__all__ = ["TRANSPORTS", "EndpointPickerServer", "ExternalProcessor", "RoutedAnswers", "_Stream"]

log = logging.getLogger("lorafleet.router")


class ExternalProcessor:
    """Envoy's ``ExternalProcessor`` service over a ``Router``."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.routes = RoutedAnswers()

    async def Process(  # noqa: N802 (the gRPC method's name)
        self, requests: AsyncIterator[Any], context: Any
    ) -> None:
        """One stream, read and written through ``context`` (cheaper per message in
        grpc.aio than iterating ``requests`` and yielding)."""
        stream = _Stream(self.router, self.routes)
        try:
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                if stream.done:
                    # Answered already (an immediate response): what the gateway sent
                    # before it read that is dropped, and the stream ends when it closes
                    # it, as a gRPC client writing on expects.
                    continue
                stream.note(message)
                try:
                    if message.WhichOneof("request") == "request_body":
                        responses = await stream.body(message.request_body)
                    else:
                        responses = stream.answer(message)
                except ValueError as exc:  # messages out of the protocol's order
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                    return
                for response in responses:
                    await context.write(response)
        finally:
            stream.finish()


#: The picker's transports: its own HTTP/2 server (``router.picker_h2``), or grpc.aio.
TRANSPORTS = ("h2", "grpc.aio")


class EndpointPickerServer:
    """The gRPC server of the endpoint picker, started on the router's event loop:
    ext_proc and ``grpc.health.v1.Health`` (``router.picker_health``) on one port.

    ``transport``: ``"h2"`` (the default), the picker's own HTTP/2 server
    (``router.picker_h2``, its calls in ``router.picker_calls``), a fraction of
    grpc.aio's cost per stream; ``"grpc.aio"``, grpcio's server, as before."""

    def __init__(self, router: Router, *, host: str, port: int, transport: str = "h2") -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"no picker transport {transport!r}: one of {TRANSPORTS}")
        self.router = router
        self.host, self.transport = host, transport
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.requested_port = port
        self.port: int | None = None
        self._server: Any = None

    async def start(self) -> int:
        """Listen (port 0: the kernel's choice) and serve; the port bound."""
        if self.transport == "h2":
            port = await self._start_h2()
        else:
            port = await self._start_grpc_aio()
        log.info(
            "endpoint picker (Envoy ext_proc over %s) listening on port %d", self.transport, port
        )
        return port

    async def _start_h2(self) -> int:
        # Here: router.picker_calls drives this module's _Stream.
        from placement.router.picker_calls import picker_methods
        from placement.router.picker_h2 import GrpcH2Server

        settings = self.router.settings
        # A body and its envelope fit in one message (the 413 is the picker's to give).
        limit = max(4 * 1024 * 1024, 2 * settings.max_body_bytes)
        server = GrpcH2Server(picker_methods(self.router), max_message_bytes=limit)
        host = self.host if self.host not in ("", "*") else None
        port = await server.start(host, self.requested_port)
        self._server, self.port = server, port
        return port

    async def _start_grpc_aio(self) -> int:
        server = grpc.aio.server()
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessor(self.router), server
        )
        add_health(self.router, server)  # on the same port, as gateways probe it
        port = int(server.add_insecure_port(self.address))
        if port == 0:
            raise OSError(f"the endpoint picker cannot listen on {self.address}")
        await server.start()
        self._server, self.port = server, port
        return port

    async def stop(self, *, grace_s: float | None = None) -> None:
        """Stop accepting streams; those open get ``grace_s`` to end."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
