"""Adapters the traffic names but the catalog lacks: which ones, and the catalog with them.

The war story's unannounced A/B variants: requests arrive for adapters nobody listed.
With ``InputSettings.adapter_source_template`` set, ``catalog_with_traffic`` gives each
such name a catalog entry (``placement.inputs.catalog.unannounced_adapter``: the
template's source, the ``unannounced_*`` rank, size and class) in the pool its
requests went to, so the next forecast and plan treat it like any other adapter.
Without a template, or for a name no source can be made from (not a DNS label, a
source the rules refuse, no pool to serve it, over ``unannounced_max``), the name
stays unplanned and ``CatalogUpdate.unplanned`` says why.

A forecast fitted on days of history has nothing to say about a name that appeared
an hour ago (``level-profile`` gives it zero: no profile yet), so ``newcomer_floor``
lifts each newcomer's demand (first request within the last day) to what it has done
since it appeared: its mean rate and the 90th percentile of its buckets.

Names of the fleet's base models (requests to the base model itself) are never
adapters. Pure: a history frame, a catalog, a fleet and the rules in, a catalog out;
the controller's ingest (``placement.controller.ticks``) does the reading and swapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import pandas as pd

from placement.domain import Adapter, AdapterId, Catalog, Fleet, Pool
from placement.inputs.catalog import unannounced_adapter
from placement.inputs.request_log import RequestLog
from placement.settings import InputSettings
from placement.solver.problem import Demand

#: A name first seen less than this long ago is a newcomer: a day, the period of the
#: profiles the forecasters learn.
NEWCOMER_S = 86_400


@dataclass(frozen=True, kw_only=True)
class CatalogUpdate:
    """The catalog to put in force, and what the traffic added to it or could not."""

    catalog: Catalog
    unannounced: tuple[Adapter, ...] = ()
    #: Names in the traffic that the catalog lacks and that stay unplanned, with why.
    unplanned: Mapping[AdapterId, str] = field(default_factory=dict)


def traffic_by_name(history: RequestLog) -> dict[str, tuple[int, frozenset[str]]]:
    """Each name in the history: its requests and the pods that served them."""
    frame = history.frame
    if frame.empty:
        return {}
    weights = frame["requests"] if history.aggregated else pd.Series(1, index=frame.index)
    adapters = frame["adapter"].astype(str)
    requests = weights.groupby(adapters, observed=True).sum()
    pods: dict[str, frozenset[str]] = {}
    if "pod" in frame:
        served = frame.loc[frame["pod"].notna(), ["adapter", "pod"]].astype(str)
        for name, group in served.groupby("adapter", observed=True)["pod"]:
            pods[str(name)] = frozenset(group.unique())
    return {
        str(name): (int(count), pods.get(str(name), frozenset()))
        for name, count in requests.items()
    }


def catalog_with_traffic(
    declared: Catalog,
    traffic: Mapping[str, tuple[int, frozenset[str]]],
    *,
    fleet: Fleet,
    rules: InputSettings,
) -> CatalogUpdate:
    """``declared`` with an entry for each name of ``traffic`` it lacks, busiest first,
    as far as the template and ``unannounced_max`` allow; the rest in ``unplanned``."""
    known = {str(name) for name in declared.names()}
    known |= {p.base_model for p in fleet.pools} | {p.served_model_name for p in fleet.pools}
    unknown = sorted(
        (name for name in traffic if name not in known), key=lambda n: (-traffic[n][0], n)
    )
    added: list[Adapter] = []
    unplanned: dict[AdapterId, str] = {}
    for name in unknown:
        why = _why_not(name, traffic[name][1], fleet=fleet, rules=rules, added=len(added))
        if isinstance(why, Adapter):
            added.append(why)
        else:
            unplanned[AdapterId(name)] = why
    catalog = Catalog(adapters=(*declared.adapters, *added))
    return CatalogUpdate(catalog=catalog, unannounced=tuple(added), unplanned=unplanned)


def _why_not(
    name: str, pods: frozenset[str], *, fleet: Fleet, rules: InputSettings, added: int
) -> Adapter | str:
    """The entry ``name`` gets, or why it gets none."""
    if rules.adapter_source_template is None:
        return "not in the catalog, and no adapter_source_template to load it from"
    if added >= rules.unannounced_max:
        return f"over unannounced_max ({rules.unannounced_max}): busier ones came first"
    pool = _pool_for(pods, fleet)
    if pool is None:
        return (
            f"no pool to serve it: the fleet has {len(fleet.pools)} pools and its "
            "requests name no pod of one"
        )
    if rules.unannounced_rank > pool.max_lora_rank:
        return (
            f"unannounced_rank {rules.unannounced_rank} is above max_lora_rank "
            f"{pool.max_lora_rank} of pool {pool.name}"
        )
    try:
        return unannounced_adapter(name, base_model=pool.base_model, rules=rules)
    except ValueError as exc:
        return str(exc)


def _pool_for(pods: frozenset[str], fleet: Fleet) -> Pool | None:
    """The one pool whose pods served the name, else the fleet's only pool."""
    owners = {pool.name: pool for pool in fleet.pools for pod in pool.pods if pod.name in pods}
    if len(owners) == 1:
        return next(iter(owners.values()))
    if len(fleet.pools) == 1:
        return fleet.pools[0]
    return None


def newcomer_floor(
    demand: Mapping[AdapterId, Demand],
    history: RequestLog,
    *,
    now: datetime,
    bucket_s: int,
    window_s: int,
) -> dict[AdapterId, Demand]:
    """``demand`` with each newcomer's at least its recent traffic: the requests of the
    last ``window_s`` (or since it appeared, if later) over that time, and the 90th
    percentile of its ``bucket_s`` buckets there."""
    counts = history.counts(bucket_s)
    floored = dict(demand)
    if counts.empty:
        return floored
    end = pd.Timestamp(now)
    first = counts.groupby("adapter", observed=True)["ts"].min()
    newcomers = first[first > end - pd.Timedelta(seconds=NEWCOMER_S)]
    for name, since in newcomers.items():
        start = max(since, (end - pd.Timedelta(seconds=window_s)).floor(f"{bucket_s}s"))
        mine = counts[(counts["adapter"] == name) & (counts["ts"] >= start) & (counts["ts"] < end)]
        if mine.empty:
            continue
        span_s = max(float(bucket_s), (end - start).total_seconds())
        mean_rps = float(mine["requests"].sum()) / span_s
        q90_rps = float(mine["requests"].quantile(0.9)) / bucket_s
        old = floored.get(AdapterId(str(name)), Demand(mean_rps=0.0, q90_rps=0.0))
        floored[AdapterId(str(name))] = Demand(
            mean_rps=max(old.mean_rps, mean_rps), q90_rps=max(old.q90_rps, q90_rps, mean_rps)
        )
    return floored
