"""The requests a replay feeds the simulator, as plain columns on a seconds clock.

Owns the conversion of a request log (per request or pre-aggregated) into parallel
Python lists: arrival seconds since the first request, adapter, prompt and output
tokens. A pre-aggregated log is spread evenly over each bucket, with the given
default lengths. Pandas is used here once; the engine itself never touches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd

from placement.domain import Catalog
from placement.errors import InputError, Problem
from placement.inputs.request_log import RequestLog

DEFAULT_PROMPT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 128


@dataclass(frozen=True, kw_only=True)
class SimWorkload:
    """Requests sorted by arrival, with their adapters' sizes."""

    start: datetime
    arrival_s: list[float]
    adapters: list[str]
    prompt_tokens: list[int]
    output_tokens: list[int]
    size_bytes: dict[str, int]
    #: The event each request was caused by (the log's optional ``event_id``); empty
    #: when the log has no such column.
    event_ids: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return self.arrival_s[-1] if self.arrival_s else 0.0


def _column(frame: pd.DataFrame, name: str, default: int) -> list[int]:
    if name not in frame.columns:
        return [default] * len(frame)
    values = pd.to_numeric(frame[name], errors="coerce").fillna(default)
    return [max(1, int(value)) for value in values.to_numpy()]


def _expand(frame: pd.DataFrame, bucket_s: float) -> pd.DataFrame:
    """One row per request of a pre-aggregated log, spread evenly in its bucket."""
    counts = frame["requests"].astype("int64").to_numpy()
    rows = frame.loc[frame.index.repeat(counts)].reset_index(drop=True)
    offsets = np.concatenate([(np.arange(n) + 0.5) / n for n in counts if n > 0])
    rows["ts"] = rows["ts"] + pd.to_timedelta(offsets * bucket_s, unit="s")
    return rows.drop(columns=["requests"]).sort_values("ts", kind="stable")


def workload_from_log(log: RequestLog, catalog: Catalog, *, bucket_s: float) -> SimWorkload:
    """The log's requests; every adapter must be in the catalog (its size decides loads)."""
    frame = _expand(log.frame, bucket_s) if log.aggregated else log.frame
    if frame.empty:
        raise InputError([Problem(source=log.source, message="the request log has no requests")])
    sizes = {str(adapter.name): adapter.size_bytes for adapter in catalog.adapters}
    adapters = [str(name) for name in frame["adapter"].astype(str).to_numpy()]
    unknown = sorted(set(adapters) - sizes.keys())
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise InputError(
            [Problem(source=log.source, message=f"adapters not in the catalog: {shown}")]
        )
    stamps = frame["ts"]
    start = stamps.iloc[0].to_pydatetime()
    seconds = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy(dtype=float)
    return SimWorkload(
        start=start,
        arrival_s=seconds.tolist(),
        adapters=adapters,
        prompt_tokens=_column(frame, "prompt_tokens", DEFAULT_PROMPT_TOKENS),
        output_tokens=_column(frame, "output_tokens", DEFAULT_OUTPUT_TOKENS),
        size_bytes=sizes,
        event_ids=_event_ids(frame),
    )


def _event_ids(frame: pd.DataFrame) -> list[str | None]:
    if "event_id" not in frame.columns:
        return []
    column = frame["event_id"].astype(object)
    present = column.notna().to_numpy()
    return [
        str(value) if keep and str(value) else None
        for value, keep in zip(column.to_numpy(), present, strict=True)
    ]
