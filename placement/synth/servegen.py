"""Request logs from a public ServeGen client folder: one client = one adapter.

A ServeGen folder (``alibaba/ServeGen``'s ``data/language/m-mid``) holds one CSV per
API client of one model, ``chunk-<id>-trace.csv``, without a header: per 600 s window
from midnight, the window start (s), the client's mean rate (req/s), the CV of its
inter-arrival times, their distribution (``Gamma``, ``Weibull`` or empty when idle) and
that distribution's shape and scale. Each window becomes requests: their count is
Poisson with the window's rate (times ``scale``), their spacing follows the window's
inter-arrival distribution (its shape; the gaps are stretched to fill the window), so
both each client's demand curve and its burstiness survive. Token lengths are not in
the folder: they are drawn as ``lorafleet synth`` draws them.

``read_servegen`` reads the folder (the one function here that touches files);
``servegen_requests`` is pure, its random generator a parameter. ``catalog_stub`` and
``fleet_stub`` give YAML for a first replay: ranks round-robin over 8-128 (as S-LoRA
and Chameleon assign them), q_proj and v_proj, one pool.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from placement.errors import InputError, Problem
from placement.inputs.json_lines import lines_entry

WINDOW_S = 600.0
COLUMNS = ("t", "rate", "cv", "pattern", "shape", "scale")
PATTERNS = ("Gamma", "Weibull")
_CLIENT = re.compile(r"^chunk-(\d+)-trace\.csv$")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
RANKS = (8, 16, 32, 64, 128)


@dataclass(frozen=True, kw_only=True)
class Client:
    """One client's windows: ``t`` (s from the trace's midnight), ``rate`` (req/s),
    ``pattern``, ``shape``, as arrays of equal length."""

    name: str
    t: np.ndarray
    rate: np.ndarray
    pattern: np.ndarray
    shape: np.ndarray

    @property
    def mean_rps(self) -> float:
        return float(self.rate.mean()) if self.rate.size else 0.0


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """Lognormal token lengths: medians and log-space sigmas (synth's defaults)."""

    prompt_median: float = 1020.0
    prompt_sigma: float = 0.9
    output_median: float = 129.0
    output_sigma: float = 1.0


def _window_lines(text: str) -> list[int]:
    """The number of each line of ``text`` that is not blank, counted from 1 as the file
    counts them: the lines pandas' reader makes windows of (it skips lines of only
    spaces and tabs)."""
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()  # the break that ends the last line opens no line
    return [number for number, line in enumerate(lines, start=1) if line.strip(" \t")]


def _windows_entry(text: str, frame: pd.DataFrame, rows: pd.Series) -> str:
    """The lines of the windows at ``rows`` ("line 3", "lines 3, 7")."""
    lines = _window_lines(text)
    if len(lines) == len(frame):
        return lines_entry([lines[int(i)] for i in frame.index[rows]])
    # a quoted field across lines (never in ServeGen's files): windows, not lines
    return "window" + lines_entry([int(i) + 1 for i in frame.index[rows]])[len("line") :]


def _client(path: Path, prefix: str) -> Client:
    try:
        text = path.read_text(encoding="utf-8-sig")
        frame = pd.read_csv(
            io.StringIO(text), header=None, names=list(COLUMNS), dtype={"pattern": str}
        )
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise InputError([Problem(source=str(path), message=f"cannot read: {exc}")]) from None
    if len(frame) == 0:
        raise InputError(
            [Problem(source=str(path), message="not a ServeGen client trace: no windows")]
        )
    numbers = frame[["t", "rate", "shape"]].apply(pd.to_numeric, errors="coerce")
    bad = numbers.isna().any(axis=1) | (numbers["rate"] < 0) | ~np.isfinite(numbers["rate"])
    # A window at t = inf became requests at no time (NaT rows in the log written), one
    # at t < 0 requests before --start: the trace's windows start at its midnight.
    bad_time = ~bad & (~np.isfinite(numbers["t"]) | (numbers["t"] < 0))
    problems = [
        Problem(
            source=str(path),
            entry=_windows_entry(text, frame, rows),
            message=f"not a ServeGen client trace: {message}",
        )
        for rows, message in (
            (bad, "not numbers or a rate below 0"),
            (bad_time, "a window's time t is not a finite number of seconds from 0"),
        )
        if rows.any()
    ]
    if problems:
        raise InputError(problems)
    number = int(_CLIENT.match(path.name).group(1))  # type: ignore[union-attr]
    name = f"{prefix}{number:03d}"
    pattern = frame["pattern"].fillna("")
    _check_distributions(path, text, frame, name=name, pattern=pattern, shape=numbers["shape"])
    return Client(
        name=name,
        t=numbers["t"].to_numpy(dtype=float),
        rate=numbers["rate"].to_numpy(dtype=float),
        pattern=pattern.to_numpy(dtype=object),
        shape=numbers["shape"].to_numpy(dtype=float),
    )


def _check_distributions(
    path: Path, text: str, frame: pd.DataFrame, *, name: str, pattern: pd.Series, shape: pd.Series
) -> None:
    """Each window's inter-arrival distribution is one ``_gaps`` draws: an unknown
    ``pattern`` was drawn as exponential gaps, and a shape of 0 or below (or infinite)
    as a shape of 1, in silence. An idle window has no pattern, and shape 0."""
    known = pattern.isin(PATTERNS)
    bad_pattern = ~known & (pattern != "")
    bad_shape = ~bad_pattern & (~np.isfinite(shape) | (shape < 0) | (known & ~(shape > 0)))
    accepted = f"accepted: {', '.join(PATTERNS)}, or empty in an idle window"
    problems = [
        Problem(
            source=str(path),
            entry=f"client {name}: {_windows_entry(text, frame, rows)}",
            field=field,
            message=f"{message}, got {_examples(values[rows])}",
        )
        for field, rows, values, message in (
            ("pattern", bad_pattern, pattern, f"not a ServeGen distribution ({accepted})"),
            (
                "shape",
                bad_shape,
                shape,
                "expected a finite number above 0 for a Gamma or Weibull window (0 in an idle one)",
            ),
        )
        if rows.any()
    ]
    if problems:
        raise InputError(problems)


def _examples(values: pd.Series) -> str:
    """The first few distinct values, as written: "'Exponential', 'gamma'"."""
    shown = list(dict.fromkeys(values.tolist()))
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    return ", ".join(repr(v) if isinstance(v, str) else f"{v:g}" for v in shown[:3]) + more


def read_servegen(
    folder: str | os.PathLike[str], *, days: float | None = None, prefix: str = "client-"
) -> list[Client]:
    """The folder's clients with any demand in the first ``days`` (all, when None)."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError([Problem(source=str(root), message="not a folder")])
    paths = sorted(
        (p for p in root.iterdir() if _CLIENT.match(p.name)),
        key=lambda p: int(_CLIENT.match(p.name).group(1)),  # type: ignore[union-attr]
    )
    if not paths:
        raise InputError(
            [Problem(source=str(root), message="no ServeGen client files (chunk-<id>-trace.csv)")]
        )
    clients = []
    for path in paths:
        client = _client(path, prefix)
        if days is not None:
            keep = client.t < days * 86_400
            client = Client(
                name=client.name,
                t=client.t[keep],
                rate=client.rate[keep],
                pattern=client.pattern[keep],
                shape=client.shape[keep],
            )
        if client.rate.sum() > 0:
            clients.append(client)
    return clients


def _gaps(rng: np.random.Generator, pattern: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """One inter-arrival gap per entry, in units of its distribution's scale."""
    gaps = rng.exponential(1.0, size=pattern.size)
    safe = np.where(np.isfinite(shape) & (shape > 0), shape, 1.0)
    gamma = pattern == "Gamma"
    weibull = pattern == "Weibull"
    if gamma.any():
        gaps[gamma] = rng.gamma(safe[gamma], 1.0)
    if weibull.any():
        gaps[weibull] = rng.weibull(safe[weibull])
    # A Weibull of shape far below 1 draws gaps that overflow; cap them, so a window
    # stays a window (one huge gap then leaves its requests bunched at the start).
    return np.clip(np.nan_to_num(gaps, nan=1.0, posinf=1e300), 1e-300, 1e300)


def client_arrivals(rng: np.random.Generator, client: Client, *, scale: float) -> np.ndarray:
    """Arrival times (s from the trace's midnight) of one client's requests, sorted."""
    counts = rng.poisson(np.maximum(client.rate, 0.0) * scale * WINDOW_S)
    active = np.nonzero(counts)[0]
    if not active.size:
        return np.empty(0)
    # n + 1 gaps per window with n requests: the last gap closes the window, so the n
    # requests keep the distribution's relative spacing and fill the window.
    sizes = counts[active] + 1
    window = np.repeat(active, sizes)
    gaps = _gaps(rng, client.pattern[window], client.shape[window])
    first = np.cumsum(sizes) - sizes
    # Each window's gaps relative to its largest: a window sums to at most its size, so
    # the running sum below stays small enough for every window's spacing to survive.
    gaps = gaps / np.repeat(np.maximum.reduceat(gaps, first), sizes)
    cumulative = np.cumsum(gaps)
    within = cumulative - np.repeat(cumulative[first] - gaps[first], sizes)
    closing = first + sizes - 1
    share = within / np.repeat(within[closing], sizes)
    keep = np.ones(gaps.size, dtype=bool)
    keep[closing] = False
    return np.sort(client.t[window][keep] + share[keep] * WINDOW_S)


def scale_for(clients: list[Client], rps: float) -> float:
    """The factor that makes the clients' mean total rate ``rps``."""
    total = sum(client.mean_rps for client in clients)
    return rps / total if total > 0 else 0.0


def servegen_requests(
    clients: list[Client],
    *,
    rng: np.random.Generator,
    start: datetime,
    scale: float,
    lengths: Lengths = Lengths(),
) -> pd.DataFrame:
    """A request log (ts, adapter, tenant, prompt_tokens, output_tokens), sorted by ts:
    each client's windows turned into requests; the trace's midnight is ``start``."""
    times = [client_arrivals(rng, client, scale=scale) for client in clients]
    names = [
        np.full(len(t), client.name, dtype=object) for t, client in zip(times, clients, strict=True)
    ]
    seconds = np.concatenate(times) if times else np.empty(0)
    adapters = np.concatenate(names) if names else np.empty(0, dtype=object)
    order = np.argsort(seconds, kind="stable")
    seconds, adapters = seconds[order], adapters[order]
    size = len(seconds)
    origin = pd.Timestamp(start).tz_convert("UTC")
    stamps = origin + pd.to_timedelta(np.round(seconds * 1000).astype("int64"), unit="ms")

    def tokens(median: float, sigma: float) -> np.ndarray:
        return np.maximum(1, rng.lognormal(np.log(median), sigma, size)).astype("int32")

    return pd.DataFrame(
        {
            "ts": stamps,
            "adapter": pd.Categorical(adapters),
            "tenant": pd.Categorical(adapters),
            "prompt_tokens": tokens(lengths.prompt_median, lengths.prompt_sigma),
            "output_tokens": tokens(lengths.output_median, lengths.output_sigma),
        }
    )


def catalog_stub(clients: list[Client], *, base_model: str, folder: str) -> str:
    """catalog.yaml text: one adapter per client, ranks round-robin over 8-128."""
    lines = [
        f"# One adapter per ServeGen client of {folder} (lorafleet convert servegen).",
        "# Ranks are not in the trace: round-robin over 8, 16, 32, 64, 128 on q_proj, v_proj.",
        "adapters:",
    ]
    for i, client in enumerate(clients):
        lines += [
            f"- name: {client.name}",
            f"  base_model: {base_model}",
            f"  rank: {RANKS[i % len(RANKS)]}",
            "  target_modules: [q_proj, v_proj]",
            f"  source: s3://adapters/{client.name}",
            f"  tenant: {client.name}",
        ]
    return "\n".join(lines) + "\n"


def fleet_stub(*, base_model: str, pods: int, max_loras: int, max_cpu_loras: int) -> str:
    """fleet.yaml text: one vLLM pool of ``pods`` pods on local ports."""
    lines = [
        "# A first fleet for replaying a converted ServeGen folder; edit to your pods.",
        "pools:",
        "- name: servegen",
        f"  base_model: {base_model}",
        "  engine: vllm",
        f"  max_lora_rank: {max(RANKS)}",
        f"  pod_defaults: {{max_loras: {max_loras}, max_cpu_loras: {max_cpu_loras},"
        " hbm_adapter_bytes: 8GiB, host_adapter_bytes: 32GiB, capacity_rps: 10}",
        "  pods:",
    ]
    lines += [f"  - {{name: pod-{i}, url: 'http://127.0.0.1:{18000 + i}'}}" for i in range(pods)]
    return "\n".join(lines) + "\n"
