"""``lorafleet router``: serve the plan-following OpenAI-compatible proxy."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from placement.cli.app import app, err, report_errors
from placement.clock import Clock, clock_from_options
from placement.domain import Catalog, Fleet
from placement.errors import InputError, Problem
from placement.inputs import load_fleet
from placement.inputs.catalog import CatalogFile
from placement.inputs.sources import check_source_template
from placement.router.asgi import RouterApp
from placement.router.picking import POLICIES
from placement.router.sources import FilePlanSource, PlanSource, PodSource
from placement.router.wiring import RouterWithPicker, build_router, run_router, write_port_file
from placement.router.workers import serve_workers, worker_log_path
from placement.settings import InputSettings, Settings

CONFIGMAP_PREFIX = "configmap:"


def _configmap_source(spec: str) -> PlanSource:
    from placement.adapters.kube import KubePlanStore, KubeTarget, connect
    from placement.router.kube_sources import StorePlanSource

    namespace, _, name = spec.removeprefix(CONFIGMAP_PREFIX).partition("/")
    if not namespace or not name:
        raise InputError(
            [Problem(source="--plan", message=f"expected configmap:NAMESPACE/NAME, got {spec!r}")]
        )
    target = KubeTarget(namespace=namespace, plan_configmap=name)
    return StorePlanSource(KubePlanStore(connect(), target=target), description=spec)


def _selector_source(selector: str, namespace: str, fleet: Fleet | None) -> PodSource:
    from placement.adapters.kube import KubePods, KubeTarget, connect
    from placement.router.kube_sources import DiscoveryPodSource

    target = KubeTarget(namespace=namespace, selector=selector)
    return DiscoveryPodSource(
        KubePods(connect(), target=target), fleet=fleet, description=f"selector {selector}"
    )


def _plan_source(plan: str | None) -> PlanSource | None:
    if plan is None:
        return None
    if plan.startswith(CONFIGMAP_PREFIX):
        return _configmap_source(plan)
    return FilePlanSource(Path(plan))


def _picker_transport(given: str | None, serving: bool) -> str:
    """``--picker-transport``: one of the picker's transports (default h2)."""
    if given is None:
        return "h2"
    if not serving:
        message = "--picker-transport needs --endpoint-picker"
        raise InputError([Problem(source="--picker-transport", message=message)])
    # Here: grpc's import costs a third of a second a router without the picker saves.
    from placement.router.picker_grpc import TRANSPORTS

    if given not in TRANSPORTS:
        message = f"unknown picker transport {given!r}; one of {', '.join(TRANSPORTS)}"
        raise InputError([Problem(source="--picker-transport", message=message)])
    return given


def _picker_address(spec: str, host: str) -> tuple[str, int]:
    """``--endpoint-picker``: ``[HOST]:PORT`` or ``PORT`` (no host: the router's)."""
    name, _, port = spec.rpartition(":")
    name = name.strip("[]") or host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        message = f"expected [HOST]:PORT or PORT (0: a free port), got {spec!r}"
        raise InputError([Problem(source="--endpoint-picker", message=message)])
    return name, int(port)


def _with_template(settings: Settings, template: str) -> InputSettings:
    """The input rules with ``--adapter-source-template``, checked against them."""
    try:
        check_source_template(template, rules=settings.inputs)
    except ValueError as exc:
        raise InputError([Problem(source="--adapter-source-template", message=str(exc))]) from None
    return replace(settings.inputs, adapter_source_template=template)


def _clock(start: datetime | None, speed: float, origin_s: float | None) -> Clock:
    if start is not None and start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    try:
        return clock_from_options(start, speed, wall_origin_s=origin_s)
    except ValueError as exc:
        raise InputError([Problem(source="--clock-speed", message=str(exc))]) from None


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
    class_priority: Annotated[
        bool | None,
        typer.Option(
            "--class-priority/--no-class-priority",
            help="production before experiments (off by default): weigh a load's victim by"
            " its catalog class and send the warm-ups that keep a higher class resident",
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
    settings = Settings()
    given: dict[str, Any] = {
        name: value
        for name, value in (
            ("policy", policy),
            ("log_flush_s", log_flush_s),
            ("log_rotate_bytes", log_rotate_bytes),
            ("max_body_bytes", max_body_bytes),
            ("class_priority", class_priority),
        )
        if value is not None
    }
    settings = replace(settings, router=replace(settings.router, **given))
    if adapter_source_template is not None:
        settings = replace(settings, inputs=_with_template(settings, adapter_source_template))
    policy = settings.router.policy
    if policy not in POLICIES:
        raise InputError(
            [
                Problem(
                    source="--policy",
                    message=f"unknown policy {policy!r}; one of {', '.join(POLICIES)}",
                )
            ]
        )
    if (fleet is None) == (selector is None):
        raise InputError(
            [Problem(source="router", message="give exactly one of --fleet or --selector")]
        )
    if picker_port_file is not None and endpoint_picker is None:
        message = "--picker-port-file needs --endpoint-picker"
        raise InputError([Problem(source="--picker-port-file", message=message)])
    picker = _picker_address(endpoint_picker, host) if endpoint_picker is not None else None
    transport = _picker_transport(picker_transport, picker is not None)
    parsed_fleet = load_fleet(fleet) if fleet is not None else None
    catalog_file = (
        CatalogFile(catalog, fleet=parsed_fleet, rules=settings.inputs)
        if catalog is not None
        else None
    )
    parsed_catalog: Catalog | None = catalog_file.poll() if catalog_file is not None else None
    pod_source = (
        _selector_source(selector, namespace, parsed_fleet) if selector is not None else None
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per listing otherwise
    if router_workers > 1:
        if picker is not None:
            message = "--endpoint-picker serves from one router process: drop --workers"
            raise InputError([Problem(source="--workers", message=message)])
        clock_ = _clock(clock_start, clock_speed, clock_origin)

        def make_app(worker: int) -> RouterApp:
            # In the worker, after the fork: its own clients, loops and request log.
            log_path = worker_log_path(request_log, worker) if request_log else None
            return build_router(
                fleet=parsed_fleet,
                pod_source=pod_source,
                plan=_plan_source(plan),
                catalog=parsed_catalog,
                catalog_file=catalog_file,
                request_log=log_path,
                settings=settings,
                clock=clock_,
            )

        def all_listening(bound: int) -> None:
            if port_file is not None:
                write_port_file(port_file, bound)
            err().print(f"lorafleet router on http://{host}:{bound} ({router_workers} workers)")

        status = serve_workers(
            make_app, host=host, port=port, workers=router_workers, on_listening=all_listening
        )
        raise typer.Exit(status)
    app_ = build_router(
        fleet=parsed_fleet,
        pod_source=pod_source,
        plan=_plan_source(plan),
        catalog=parsed_catalog,
        catalog_file=catalog_file,
        request_log=request_log,
        settings=settings,
        clock=_clock(clock_start, clock_speed, clock_origin),
    )
    if plan is None and policy == "plan":
        err().print("no --plan: routing every adapter by consistent hashing")

    def listening(bound: int) -> None:
        if port_file is not None:
            write_port_file(port_file, bound)
        err().print(f"lorafleet router on http://{host}:{bound}")

    if picker is None:
        run_router(app_, host=host, port=port, on_listening=listening)
        return
    picker_host, picker_port = picker

    def picker_listening(bound: int) -> None:
        if picker_port_file is not None:
            write_port_file(picker_port_file, bound)
        where = f"{picker_host}:{bound}"
        err().print(f"lorafleet endpoint picker (Envoy ext_proc over {transport}) on {where}")

    with_picker = RouterWithPicker(
        app_,
        host=picker_host,
        port=picker_port,
        on_picker_listening=picker_listening,
        transport=transport,
    )
    run_router(with_picker, host=host, port=port, on_listening=listening)
