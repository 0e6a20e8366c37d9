"""The endpoint picker's gRPC health service (``grpc.health.v1.Health``).

Gateways and Kubernetes probe an endpoint picker over gRPC, on its own port: a
``grpc:`` readiness probe (kubelet), an Envoy cluster's gRPC health check, GKE's health
check of the picker's backend. The Gateway API Inference Extension's reference picker
answers on these service names (cmd/epp/runner/health.go):

- ``""``, ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor``: SERVING
  when the picker can pick: the router's ``not_ready`` is empty (its loops alive, a
  plan read where one is expected, a healthy pod); NOT_SERVING otherwise;
- ``liveness``: SERVING while no loop ended or is stuck (``Router.problems``), so a
  picker waiting for its first plan is not restarted;
- any other name: ``Check`` fails with NOT_FOUND (the protocol's rule) and ``Watch``
  answers SERVICE_UNKNOWN.

``Watch`` sends the status at once and again whenever it changes; the router's state
changes at its rounds, so it looks again every ``scrape_interval_s`` (and ends when the
client goes). The status is read at each call, never cached: there is nothing to keep in
step with the router.

Must not decide anything: it only reports ``Router``'s own verdicts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from placement.router.core import Router

#: The ext_proc service's full name, as gateways name it in their probes.
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READINESS = "readiness"
LIVENESS = "liveness"
#: Names whose status is the picker's readiness.
_READY_NAMES = frozenset({"", READINESS, EXT_PROC_SERVICE})

_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class PickerHealth(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """``grpc.health.v1.Health`` over a ``Router``'s own readiness and liveness."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def status(self, service: str) -> int:
        """The status of ``service`` now (SERVICE_UNKNOWN for a name not served)."""
        if service in _READY_NAMES:
            return _NOT_SERVING if self.router.not_ready() else _SERVING
        if service == LIVENESS:
            return _NOT_SERVING if self.router.problems() else _SERVING
        return _UNKNOWN

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        status = self.status(request.service)
        if status == _UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> None:  # noqa: N802 (gRPC's name)
        sent: int | None = None
        while True:
            status = self.status(request.service)
            if status != sent:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                sent = status
            await asyncio.sleep(self.router.settings.scrape_interval_s)


def add_health(router: Router, server: Any) -> PickerHealth:
    """Serve the picker's health on ``server`` (a ``grpc.aio`` server)."""
    health = PickerHealth(router)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    return health
