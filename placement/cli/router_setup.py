"""What ``lorafleet router``'s flags become: the settings tree, the endpoint picker's
address and the parts every router process is built from.

Parses and checks the flags (a mistake is an ``InputError`` naming the flag) and reads
the fleet and catalog files; must not serve anything (``router_cmds`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from placement.clock import Clock, clock_from_options
from placement.domain import Catalog, Fleet
from placement.errors import InputError, Problem
from placement.inputs import load_fleet
from placement.inputs.catalog import CatalogFile
from placement.inputs.sources import check_source_template
from placement.router.asgi import RouterApp
from placement.router.picking import POLICIES
from placement.router.sources import FilePlanSource, PlanSource, PodSource
from placement.router.wiring import build_router
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


def clock_from_flags(start: datetime | None, speed: float, origin_s: float | None) -> Clock:
    if start is not None and start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    try:
        return clock_from_options(start, speed, wall_origin_s=origin_s)
    except ValueError as exc:
        raise InputError([Problem(source="--clock-speed", message=str(exc))]) from None


@dataclass(frozen=True, kw_only=True)
class EndpointPicker:
    """Where ``--endpoint-picker`` listens, over which transport, and its port file."""

    host: str
    port: int
    transport: str
    port_file: Path | None


@dataclass(frozen=True, kw_only=True)
class RouterParts:
    """What every router process is built from, parsed once in the parent."""

    plan: str | None
    fleet: Fleet | None
    pod_source: PodSource | None
    catalog: Catalog | None
    catalog_file: CatalogFile | None
    settings: Settings

    def build(self, *, request_log: Path | None, clock: Callable[[], Clock]) -> RouterApp:
        """The router app; ``clock`` is called after the plan source is made (its
        errors come first)."""
        plan = _plan_source(self.plan)
        return build_router(
            fleet=self.fleet,
            pod_source=self.pod_source,
            plan=plan,
            catalog=self.catalog,
            catalog_file=self.catalog_file,
            request_log=request_log,
            settings=self.settings,
            clock=clock(),
        )


def router_settings(
    *,
    policy: str | None,
    log_flush_s: float | None,
    log_rotate_bytes: int | None,
    max_body_bytes: int | None,
    client_keepalive_s: int | None,
    class_priority: bool | None,
    price_slot_wait: bool | None,
    adapter_source_template: str | None,
) -> Settings:
    """The settings tree with the flags given over it; ``--policy`` checked."""
    settings = Settings()
    given: dict[str, Any] = {
        name: value
        for name, value in (
            ("policy", policy),
            ("log_flush_s", log_flush_s),
            ("log_rotate_bytes", log_rotate_bytes),
            ("max_body_bytes", max_body_bytes),
            ("client_keepalive_s", client_keepalive_s),
            ("class_priority", class_priority),
            ("price_slot_wait", price_slot_wait),
        )
        if value is not None
    }
    settings = replace(settings, router=replace(settings.router, **given))
    if adapter_source_template is not None:
        settings = replace(settings, inputs=_with_template(settings, adapter_source_template))
    chosen = settings.router.policy
    if chosen not in POLICIES:
        message = f"unknown policy {chosen!r}; one of {', '.join(POLICIES)}"
        raise InputError([Problem(source="--policy", message=message)])
    return settings


def picker_from_flags(
    spec: str | None, *, port_file: Path | None, transport: str | None, host: str
) -> EndpointPicker | None:
    """The picker the flags ask for, or None; its flags without ``--endpoint-picker``
    are mistakes."""
    if port_file is not None and spec is None:
        message = "--picker-port-file needs --endpoint-picker"
        raise InputError([Problem(source="--picker-port-file", message=message)])
    address = _picker_address(spec, host) if spec is not None else None
    chosen = _picker_transport(transport, address is not None)
    if address is None:
        return None
    return EndpointPicker(host=address[0], port=address[1], transport=chosen, port_file=port_file)


def router_parts(
    *,
    plan: str | None,
    fleet: Path | None,
    selector: str | None,
    namespace: str,
    catalog: Path | None,
    settings: Settings,
) -> RouterParts:
    """The fleet, the catalog (read once now, then on change) and the pod source."""
    parsed_fleet = load_fleet(fleet) if fleet is not None else None
    catalog_file = (
        CatalogFile(catalog, fleet=parsed_fleet, rules=settings.inputs)
        if catalog is not None
        else None
    )
    return RouterParts(
        plan=plan,
        fleet=parsed_fleet,
        pod_source=(
            _selector_source(selector, namespace, parsed_fleet) if selector is not None else None
        ),
        catalog=catalog_file.poll() if catalog_file is not None else None,
        catalog_file=catalog_file,
        settings=settings,
    )
