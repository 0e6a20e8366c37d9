"""Helpers of the controller tests: their two-pod fleet, and a document pipeline.

Plans, adapters and the fake clock are ``tests.factories``'.
"""

from __future__ import annotations

from types import MappingProxyType

from placement.domain import (
    AdapterId,
    Catalog,
    Fleet,
    Pipeline,
    Pipelines,
    PipelineStep,
    TenantId,
)
from placement.sizing import BUILTIN_MODELS
from tests.factories import BASE, adapter, catalog, fleet, pool


def make_fleet(pods: int = 2, *, max_loras: int = 2, urls: tuple[str, ...] = ()) -> Fleet:
    """Llama-3.1-8B pods pod-0.. in pool "llama", four host slots per GPU slot."""
    return fleet(
        pool(
            "llama",
            pods,
            served_model="llama",
            pod_prefix="pod",
            dims=BUILTIN_MODELS[BASE],
            urls=urls,
            max_loras=max_loras,
            max_cpu_loras=4 * max_loras,
            hbm_mib=2048,
            host_mib=16384,
            capacity_rps=10.0,
        )
    )


def doc_pipelines() -> Pipelines:
    steps = (
        PipelineStep(adapter=AdapterId("doc-classifier"), probability=1.0),
        PipelineStep(adapter=AdapterId("legal-extract"), probability=0.6, within_s=120),
        PipelineStep(adapter=AdapterId("medical-extract"), probability=0.4, within_s=120),
    )
    return Pipelines(
        pipelines=(Pipeline(trigger="document.uploaded", steps=steps),),
        logins=MappingProxyType({TenantId("acme"): (AdapterId("acme-chat"),)}),
    )


def doc_catalog() -> Catalog:
    return catalog(
        adapter("doc-classifier", group="docs"),
        adapter("legal-extract", group="docs"),
        adapter("medical-extract", group="docs"),
        adapter("acme-chat", tenant="acme"),
        adapter("beta-chat", tenant="beta"),
        adapter("busy-one"),
        adapter("pinned-one", pinned=True),
    )
