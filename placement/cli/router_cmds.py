"""``lorafleet router``: serve the plan-following OpenAI-compatible proxy.

The flags are parsed into settings and parts in ``router_setup``; this module serves
them: one process (with the endpoint picker if asked) or ``--workers`` N on one port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from placement.adapters.request_log_files import worker_log_path
from placement.cli.app import app, err, report_errors
from placement.cli.router_setup import (
    EndpointPicker,
    RouterParts,
    clock_from_flags,
    picker_from_flags,
    router_parts,
    router_settings,
)
from placement.clock import Clock
from placement.errors import InputError, Problem
from placement.router.asgi import RouterApp
from placement.router.picking import POLICIES
from placement.router.wiring import RouterWithPicker, run_router, write_port_file
from placement.router.workers import serve_workers


@dataclass(frozen=True, kw_only=True)
class _Serving:
    """Where and how the router serves: the flags past those its parts are built from."""

    picker: EndpointPicker | None
    request_log: Path | None
    #: Called where the clock is first needed, so that its errors come in the old order.
    clock: Callable[[], Clock]
    host: str
    port: int
    port_file: Path | None


def _quiet_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per listing otherwise


def _on_listening(port_file: Path | None, say: Callable[[int], str]) -> Callable[[int], None]:
    """Write the bound port to ``port_file`` (if any), then say where it listens."""

    def listening(bound: int) -> None:
        if port_file is not None:
            write_port_file(port_file, bound)
        err().print(say(bound))

    return listening


def _serve_workers(parts: RouterParts, serving: _Serving, *, workers: int) -> int:
    """``--workers`` N: N processes on one port; their exit status."""
    if serving.picker is not None:
        message = "--endpoint-picker serves from one router process: drop --workers"
        raise InputError([Problem(source="--workers", message=message)])
    clock = serving.clock()
    request_log = serving.request_log

    def make_app(worker: int) -> RouterApp:
        # In the worker, after the fork: its own clients, loops and request log.
        log_path = worker_log_path(request_log, worker) if request_log else None
        return parts.build(request_log=log_path, clock=lambda: clock)  # the parent's clock

    def say(bound: int) -> str:
        return f"lorafleet router on http://{serving.host}:{bound} ({workers} workers)"

    return serve_workers(
        make_app,
        host=serving.host,
        port=serving.port,
        workers=workers,
        on_listening=_on_listening(serving.port_file, say),
    )


def _serve_one(parts: RouterParts, serving: _Serving) -> None:
    """One router process, with the endpoint picker if asked, until it is stopped."""
    app_ = parts.build(request_log=serving.request_log, clock=serving.clock)
    if parts.plan is None and parts.settings.router.policy == "plan":
        err().print("no --plan: routing every adapter by consistent hashing")

    def say(bound: int) -> str:
        return f"lorafleet router on http://{serving.host}:{bound}"

    listening = _on_listening(serving.port_file, say)
    served = app_ if serving.picker is None else _with_picker(app_, serving.picker)
    run_router(served, host=serving.host, port=serving.port, on_listening=listening)


def _with_picker(app_: RouterApp, picker: EndpointPicker) -> RouterWithPicker:
    def say(bound: int) -> str:
        where = f"{picker.host}:{bound}"
        return f"lorafleet endpoint picker (Envoy ext_proc over {picker.transport}) on {where}"

    return RouterWithPicker(
        app_,
        host=picker.host,
        port=picker.port,
        on_picker_listening=_on_listening(picker.port_file, say),
        transport=picker.transport,
    )


# Past 80 lines for its option declarations alone (each flag's name, default and help
# in one place, as ``--help`` shows them); the body is a few named calls.
@app.command()
@report_errors
def router(
    plan: Annotated[
        str | None,
        typer.Option(help="plan.json (watched) or configmap:NAMESPACE/NAME; none: hashing"),
    ] = None,
    fleet: Annotated[Path | None, typer.Option(help="fleet.yaml: the pods to route to")] = None,
    selector: Annotated[
        str | None, typer.Option(help="label selector of the serving pods (Kubernetes)")
    ] = None,
    namespace: Annotated[str, typer.Option(help="namespace for --selector")] = "default",
    catalog: Annotated[
        Path | None,
        typer.Option(help="catalog.yaml: lets the router load cold adapters (re-read on change)"),
    ] = None,
    adapter_source_template: Annotated[
        str | None,
        typer.Option(
            help="where to load an adapter the catalog lacks from, e.g. s3://adapters/{name}; "
            "none: such a name is answered 404 (with a catalog)"
        ),
    ] = None,
    request_log: Annotated[
        Path | None,
        typer.Option(help="directory of hourly Parquet files, or a .jsonl file"),
    ] = None,
    log_flush_s: Annotated[
        float | None,
        typer.Option(min=0.01, help="seconds between request-log writes (what a kill can lose)"),
    ] = None,
    log_rotate_bytes: Annotated[
        int | None, typer.Option(min=1, help="rotate a .jsonl request log past this size")
    ] = None,
    max_body_bytes: Annotated[
        int | None, typer.Option(min=1, help="largest request body accepted (413 beyond)")
    ] = None,
    client_keepalive_s: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="seconds an idle client connection is kept open (default 75: above the "
            "clients' and load balancers' own, so none sends on a closing connection)",
        ),
    ] = None,
    class_priority: Annotated[
        bool | None,
        typer.Option(
            "--class-priority/--no-class-priority",
            help="production before experiments (off by default): weigh a load's victim by"
            " its catalog class and send the warm-ups that keep a higher class resident",
        ),
    ] = None,
    price_slot_wait: Annotated[
        bool | None,
        typer.Option(
            "--price-slot-wait/--no-price-slot-wait",
            help="price the wait for a GPU slot (on by default: the engines never drain for"
            " a load): a load on a pod whose every slot's adapter has requests costs"
            " load_cost.expected_drain_ms more",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="port to listen on; 0: a free one")
    ] = 8080,
    port_file: Annotated[
        Path | None,
        typer.Option(help="write the port here (one line, atomically) once listening"),
    ] = None,
    router_workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="router processes sharing the port, each with its own state (the pods' "
            "listings keep them agreeing); a request log gets one file per worker",
        ),
    ] = 1,
    policy: Annotated[
        str | None,
        typer.Option(
            help="plan (lorafleet), or a reactive baseline: "
            + ", ".join(POLICIES[1:])
            + "; default: router.policy"
        ),
    ] = None,
    clock_start: Annotated[
        datetime | None,
        typer.Option(help="demos: stamp the request log from this moment of a scenario"),
    ] = None,
    clock_speed: Annotated[
        float, typer.Option(help="demos: how many times faster than the wall clock time runs")
    ] = 1.0,
    clock_origin: Annotated[
        float | None,
        typer.Option(help="demos: the wall time (epoch s) at which the clock reads --clock-start"),
    ] = None,
    endpoint_picker: Annotated[
        str | None,
        typer.Option(
            help="also serve Envoy's ext_proc as a Gateway API endpoint picker on "
            "[HOST]:PORT (e.g. :9002; 0: a free port)"
        ),
    ] = None,
    picker_port_file: Annotated[
        Path | None,
        typer.Option(help="write the endpoint picker's port here once it listens"),
    ] = None,
    picker_transport: Annotated[
        str | None,
        typer.Option(
            help="the endpoint picker's gRPC server: h2 (its own HTTP/2 server) or "
            "grpc.aio (grpcio's); default h2"
        ),
    ] = None,
) -> None:
    """Route OpenAI requests to the pods that hold each adapter, following the plan."""
    settings = router_settings(
        policy=policy,
        log_flush_s=log_flush_s,
        log_rotate_bytes=log_rotate_bytes,
        max_body_bytes=max_body_bytes,
        client_keepalive_s=client_keepalive_s,
        class_priority=class_priority,
        price_slot_wait=price_slot_wait,
        adapter_source_template=adapter_source_template,
    )
    if (fleet is None) == (selector is None):
        raise InputError(
            [Problem(source="router", message="give exactly one of --fleet or --selector")]
        )
    picker = picker_from_flags(
        endpoint_picker, port_file=picker_port_file, transport=picker_transport, host=host
    )
    parts = router_parts(
        plan=plan,
        fleet=fleet,
        selector=selector,
        namespace=namespace,
        catalog=catalog,
        settings=settings,
    )
    _quiet_logging()
    serving = _Serving(
        picker=picker,
        request_log=request_log,
        clock=partial(clock_from_flags, clock_start, clock_speed, clock_origin),
        host=host,
        port=port,
        port_file=port_file,
    )
    if router_workers > 1:
        raise typer.Exit(_serve_workers(parts, serving, workers=router_workers))
    _serve_one(parts, serving)
