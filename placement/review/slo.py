"""SLO attainment per tenant, from a replay's per-request outcomes.

Owns the figures ``lorafleet review`` shows against each tenant's promises: the share
of its adapter-bearing requests served by an adapter already on the GPU (against the
GPU-residency promise, ``PlannerSettings.gpu_residency_target``, 97% by default) and
its TTFT p95 (against the tightest ``slo_ttft_ms`` of its adapters in the catalog).
Adapters without a tenant are grouped as one row, ``NO_TENANT``. A request the replay
shed counts against the GPU share and is left out of the TTFT percentile (it had no
first token).

Pure: reads a ``SimLog`` and a ``SimWorkload``, does no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placement.domain import Catalog
from placement.sim.engine import GPU_HIT, REJECTED, SimLog
from placement.sim.workload import SimWorkload

NO_TENANT = "(no tenant)"


@dataclass(frozen=True, kw_only=True)
class TenantAttainment:
    """One tenant's requests in one replay against its promises."""

    tenant: str
    requests: int
    gpu_share: float
    #: None when none of its requests was served (all shed).
    ttft_p95_ms: float | None
    #: The tightest TTFT SLO of the tenant's adapters; None when none has one.
    slo_ttft_ms: float | None
    gpu_target: float

    @property
    def gpu_met(self) -> bool:
        return self.gpu_share >= self.gpu_target

    @property
    def ttft_met(self) -> bool | None:
        """Whether the p95 is within the SLO; None without an SLO or a served request."""
        if self.slo_ttft_ms is None or self.ttft_p95_ms is None:
            return None
        return self.ttft_p95_ms <= self.slo_ttft_ms


def tenant_slos(catalog: Catalog) -> tuple[dict[str, str], dict[str, float]]:
    """Each adapter's tenant (``NO_TENANT`` without one) and each tenant's tightest SLO."""
    tenant_of: dict[str, str] = {}
    slo: dict[str, float] = {}
    for adapter in catalog.adapters:
        tenant = str(adapter.tenant) if adapter.tenant else NO_TENANT
        tenant_of[str(adapter.name)] = tenant
        if adapter.slo_ttft_ms is not None and adapter.slo_ttft_ms > 0:
            slo[tenant] = min(slo.get(tenant, adapter.slo_ttft_ms), adapter.slo_ttft_ms)
    return tenant_of, slo


def attainment_per_tenant(
    log: SimLog, workload: SimWorkload, catalog: Catalog, *, gpu_target: float
) -> tuple[TenantAttainment, ...]:
    """Per tenant, sorted by name (``NO_TENANT`` last): GPU share and TTFT p95."""
    tenant_of, slo = tenant_slos(catalog)
    outcome = np.asarray(log.outcome, dtype=int)
    ttft = np.asarray(log.ttft_ms, dtype=float)
    tenants = np.asarray([tenant_of.get(a, NO_TENANT) for a in workload.adapters], dtype=object)
    rows = []
    for tenant in sorted(set(tenants.tolist()), key=lambda t: (t == NO_TENANT, t)):
        mine = tenants == tenant
        served = mine & (outcome != REJECTED)
        rows.append(
            TenantAttainment(
                tenant=tenant,
                requests=int(mine.sum()),
                gpu_share=float((outcome[mine] == GPU_HIT).mean()),
                ttft_p95_ms=float(np.percentile(ttft[served], 95)) if served.any() else None,
                slo_ttft_ms=slo.get(tenant),
                gpu_target=gpu_target,
            )
        )
    return tuple(rows)


ATTAINMENT_HEADER = ("tenant", "requests", "GPU share", "TTFT p95 (ms)", "TTFT SLO (ms)", "met")


def attainment_rows(rows: Sequence[TenantAttainment]) -> list[list[str]]:
    """Table rows: the figures and which promises hold (GPU share, TTFT)."""
    return [
        [
            row.tenant,
            str(row.requests),
            f"{row.gpu_share:.2%} / {row.gpu_target:.0%}",
            "-" if row.ttft_p95_ms is None else f"{row.ttft_p95_ms:.0f}",
            "-" if row.slo_ttft_ms is None else f"{row.slo_ttft_ms:.0f}",
            _met(row),
        ]
        for row in rows
    ]


def _met(row: TenantAttainment) -> str:
    gpu = "GPU yes" if row.gpu_met else "GPU NO"
    ttft = {None: "", True: ", TTFT yes", False: ", TTFT NO"}[row.ttft_met]
    return gpu + ttft


def attainment_lines(
    before: Sequence[TenantAttainment], after: Sequence[TenantAttainment]
) -> list[str]:
    """One line per tenant, before -> after, for the text review."""
    earlier = {row.tenant: row for row in before}
    lines = []
    for row in after:
        old = earlier.get(row.tenant)
        share = f"{old.gpu_share:.2%} -> " if old is not None else ""
        line = (
            f"{row.tenant}: {row.requests} requests, on GPU {share}{row.gpu_share:.2%} "
            f"(promise {row.gpu_target:.0%}: {'met' if row.gpu_met else 'MISSED'})"
        )
        if row.ttft_p95_ms is not None:
            p95 = f"{old.ttft_p95_ms:.0f} -> " if old and old.ttft_p95_ms is not None else ""
            line += f", TTFT p95 {p95}{row.ttft_p95_ms:.0f} ms"
        if row.slo_ttft_ms is not None:
            line += f" (SLO {row.slo_ttft_ms:.0f} ms: {'met' if row.ttft_met else 'MISSED'})"
        lines.append(line)
    return lines
