"""The ext_proc servers ``bench.picker_latency`` sends its streams to, each ready for ``with``.

The picker's own server on a loop of its own in a thread (``ServerThread`` with a
router: ``router.picker_h2`` or ``grpc.aio``), and the trivial floors that answer the
picker's message pattern with one fixed endpoint and no decision: on ``grpc.aio``
(``Floor``, ``ServerThread`` without a router), on ``grpc.server``'s thread pool
(``SyncServer``) and on the picker's own HTTP/2 server (``H2Server``). Each enters to
its port and reads its CPU with ``cpu_ns``. This module sends no stream and measures
nothing: ``bench.picker_gateway`` is the client, ``bench.picker_latency`` the bench.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent import futures
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from bench.loop_server import LoopServer
from placement.router.core import Router
from placement.router.picker_calls import PROCESS
from placement.router.picker_grpc import EndpointPickerServer
from placement.router.picker_h2 import Call, GrpcH2Server


class Floor:
    """A trivial ext_proc server with the picker's message pattern and no decision:
    one fixed endpoint for every request (grpc.aio's own cost per stream)."""

    def __init__(self) -> None:
        routed = ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())
        fields = routed.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        fields["x-gateway-destination-endpoint"].string_value = "127.0.0.1:8000"
        self.routed = routed

    async def Process(self, requests: Any, context: Any) -> None:  # noqa: N802
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            if message.WhichOneof("request") == "request_body":
                # Built by field paths, as the picker builds it (nested constructors
                # copy each sub-message: several times slower).
                echoed = ext_proc.ProcessingResponse()
                streamed = echoed.request_body.response.body_mutation.streamed_response
                streamed.body = message.request_body.body
                streamed.end_of_stream = True
                await context.write(self.routed)
                await context.write(echoed)


class SyncFloor:
    """``Floor`` for grpc's thread-pool server: the handler runs in a pool thread, the
    messages come through a request iterator, the answers are yielded."""

    def __init__(self) -> None:
        self.routed = Floor().routed

    def Process(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:  # noqa: N802
        for message in requests:
            if message.WhichOneof("request") == "request_body":
                echoed = ext_proc.ProcessingResponse()
                streamed = echoed.request_body.response.body_mutation.streamed_response
                streamed.body = message.request_body.body
                streamed.end_of_stream = True
                yield self.routed
                yield echoed


class SyncServer:
    """The trivial server on ``grpc.server`` (a thread pool), for ``--transports``."""

    def __init__(self, *, threads: int = 8) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(SyncFloor(), self.server)

    def __enter__(self) -> int:
        port = int(self.server.add_insecure_port("127.0.0.1:0"))
        self.server.start()
        return port

    def cpu_ns(self) -> int:
        """The process's CPU (the handler's threads and gRPC's; the client is elsewhere)."""
        return time.process_time_ns()

    def __exit__(self, *_: object) -> None:
        self.server.stop(1.0).wait(10)


class H2FloorCall:
    """``Floor`` as a call on the picker's own HTTP/2 server (``router.picker_h2``):
    what that server costs a stream by itself."""

    def __init__(self, call: Call, routed: bytes) -> None:
        self.call, self.routed = call, routed

    def message(self, payload: bytes) -> None:
        message = ext_proc.ProcessingRequest.FromString(payload)
        if message.WhichOneof("request") == "request_body":
            echoed = ext_proc.ProcessingResponse()
            streamed = echoed.request_body.response.body_mutation.streamed_response
            streamed.body = message.request_body.body
            streamed.end_of_stream = True
            self.call.send(self.routed)
            self.call.send(echoed.SerializeToString())

    def half_closed(self) -> None:
        self.call.end()

    def cancelled(self) -> None:
        pass


class H2Server(LoopServer):
    """The trivial server on the picker's own HTTP/2 server, for ``--transports``."""

    def __init__(self) -> None:
        super().__init__()
        routed = Floor().routed.SerializeToString()
        self.server = GrpcH2Server(
            {PROCESS: lambda call: H2FloorCall(call, routed)}, max_message_bytes=1 << 22
        )

    async def _start(self) -> int:
        return await self.server.start("127.0.0.1", 0)

    async def _stop(self) -> None:
        await self.server.stop(1.0)


class ServerThread(LoopServer):
    """A gRPC server (the picker's, or the floor's) on its own event loop (uvloop, as
    the router's loop under uvicorn is; ``uvloop=False``: asyncio's), in a thread."""

    def __init__(
        self, router: Router | None, *, use_uvloop: bool = True, transport: str = "h2"
    ) -> None:
        super().__init__(use_uvloop=use_uvloop)
        self.router = router
        self.transport = transport
        self.stop: Callable[[], Coroutine[Any, Any, None]] | None = None

    async def _start(self) -> int:
        if self.router is not None:
            picker = EndpointPickerServer(
                self.router, host="127.0.0.1", port=0, transport=self.transport
            )
            self.stop = lambda: picker.stop(grace_s=1.0)
            return await picker.start()
        server = grpc.aio.server()
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(Floor(), server)
        port = int(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        self.stop = lambda: server.stop(1.0)
        return port

    async def _stop(self) -> None:
        assert self.stop is not None
        await self.stop()
