"""The router's request log as the CLI's tests write it: the rows `lorafleet router`
logs (``LogRow``), in its JSON-lines file with one rotation beside it, or in one file.

The commands that take ``--log`` (forecast, backtest, plan, replay, capacity,
recommend pins, review) read the rotation and the active file as one log; the tests
compare that with the same rows in one file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from placement.adapters.request_log_files import JsonLinesRequestLog, LogRow


def router_rows(log: Path) -> list[LogRow]:
    """A Parquet log's requests (``ts``, ``adapter``, ``tenant``) as the router logs
    them: each served on pod-0, a GPU hit, 100 prompt and 10 output tokens."""
    frame = pd.read_parquet(log)
    return [
        LogRow(ts.timestamp(), adapter, tenant, 100, 10, "pod-0", "gpu_hit", 40.0, 200)
        for ts, adapter, tenant in frame[["ts", "adapter", "tenant"]].itertuples(index=False)
    ]


def write_rotated(rows: Sequence[LogRow], active: Path, *, cut: int) -> Path:
    """``rows[:cut]`` in a rotation beside ``active`` (``<stem>.<time><suffix>``, as the
    router renames its file past ``log_rotate_bytes``) and ``rows[cut:]`` in ``active``,
    the file the router then begins; ``active``."""
    sink = JsonLinesRequestLog(active, rotate_bytes=1)  # rotated after its first batch
    sink.write(rows[:cut])
    sink.close()
    sink = JsonLinesRequestLog(active)
    sink.write(rows[cut:])
    sink.close()
    assert len(list(active.parent.iterdir())) == 2, "one rotation beside the active file"
    return active


def write_whole(rows: Sequence[LogRow], path: Path) -> Path:
    """All of ``rows`` in one JSON-lines file, as the router writes it before a rotation."""
    sink = JsonLinesRequestLog(path)
    sink.write(rows)
    sink.close()
    return path
