"""Read and check event logs: the pipeline triggers and tenant logins of a request log.

An event log (``events.parquet`` beside ``requests.parquet``; CSV and JSON lines too)
has one row per event: ``ts`` (UTC, as a request log's), ``kind`` (``pipeline`` or
``login``), ``trigger`` (a pipeline of pipelines.yaml; pipeline events only),
``tenant`` (required for logins) and ``event_id`` (unique; the webhook's id). A request
an event caused names it in the request log's optional ``event_id`` column.

``check_events`` lists every problem, one line each: unreadable values, unknown kinds,
repeated ids, events out of time order, triggers pipelines.yaml does not define,
tenants neither the catalog nor the logins know, and events outside the request log's
span (a warning: a replay never delivers them). A problem names the file's lines
for a CSV or JSON-lines log (``placement.inputs.csv_lines``: blank lines and the
header counted, a quoted field across lines one row), a Parquet log's rows from 1;
times are read as a request log's (``placement.inputs.request_log_faults``), so one past 2262
is out of range, not unparsable. ``load_events`` reads a log for use
and raises InputError on any error. Reads files; writes only through ``write_events``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pandas as pd

from placement.domain import Catalog, Pipelines
from placement.errors import InputError, Problem
from placement.inputs.catalog import parse_catalog
from placement.inputs.csv_lines import CsvLines
from placement.inputs.files import write_through
from placement.inputs.fleet import parse_fleet
from placement.inputs.json_lines import is_json_lines, read_json_lines_strictly
from placement.inputs.pipelines import parse_pipelines
from placement.inputs.request_log import load_request_log
from placement.inputs.request_log_faults import parse_ts, rows_entry, unread_times

EVENT_COLUMNS = ("ts", "kind", "trigger", "tenant", "event_id")
REQUIRED_COLUMNS = ("ts", "kind", "event_id")
KINDS = ("pipeline", "login")
#: The webhook's id pattern: an event id a controller would accept.
EVENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_SHOW = 5
_T = TypeVar("_T")


@dataclass(frozen=True)
class EventLog:
    """Events sorted by ``ts`` (tz-aware UTC), with the columns of ``EVENT_COLUMNS``."""

    frame: pd.DataFrame
    source: str = "events"

    def __len__(self) -> int:
        return len(self.frame)


@dataclass(frozen=True, kw_only=True)
class KnownNames:
    """What events may name; None: not known, so not checked."""

    triggers: frozenset[str] | None = None
    tenants: frozenset[str] | None = None
    #: The request log's first and last request.
    span: tuple[pd.Timestamp, pd.Timestamp] | None = None


def known_names(
    *,
    catalog: Catalog | None = None,
    pipelines: Pipelines | None = None,
    requests_ts: pd.Series | None = None,
) -> KnownNames:
    """Triggers from pipelines.yaml, tenants from the catalog and the logins, and the
    span of a request log's ``ts`` column."""
    tenants: set[str] = set()
    if catalog is not None:
        tenants |= {str(a.tenant) for a in catalog.adapters if a.tenant}
    if pipelines is not None:
        tenants |= {str(t) for t in pipelines.logins}
    span = None
    if requests_ts is not None and len(requests_ts):
        span = (requests_ts.min(), requests_ts.max())
    return KnownNames(
        triggers=frozenset(p.trigger for p in pipelines.pipelines) if pipelines else None,
        tenants=frozenset(tenants) if catalog is not None or pipelines is not None else None,
        span=span,
    )


def _events(count: int) -> str:
    return f"{count} event" if count == 1 else f"{count} events"


def _read(path: Path) -> tuple[pd.DataFrame, Sequence[int] | None]:
    """An event log's raw frame and, for JSON lines and CSV, each row's line in the
    file (a problem names the line: a JSON-lines file has no header, and a CSV's blank
    lines and fields across lines are no rows)."""
    if is_json_lines(path):
        read = read_json_lines_strictly(path)
        return _as_text(pd.DataFrame.from_records(read.records)), read.lines
    suffix = "".join(path.suffixes[-2:]).lower()
    try:
        if suffix.endswith(".parquet"):
            frame = pd.read_parquet(path)
            if path.is_dir() and not len(frame.columns):  # read as "missing column ts"
                raise InputError(
                    [Problem(source=str(path), message="a directory with no Parquet files")]
                )
            return frame, None
        if suffix.endswith((".csv", ".csv.gz")):
            frame = pd.read_csv(path, dtype={"trigger": str, "tenant": str, "event_id": str})
            return frame, CsvLines(path, rows=len(frame))
    except FileNotFoundError:
        raise InputError([Problem(source=str(path), message="no such file")]) from None
    except InputError:
        raise
    except Exception as exc:  # every reader raises its own types
        raise InputError([Problem(source=str(path), message=f"cannot read: {exc}")]) from None
    raise InputError(
        [Problem(source=str(path), message="unknown format: use .parquet, .csv or .jsonl")]
    )


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """JSON values of the text columns as text, as a CSV's are read (an id 7 is "7";
    a null stays missing)."""
    for name in ("kind", "trigger", "tenant", "event_id"):
        if name in frame.columns:
            values = frame[name].astype(object)
            frame[name] = values.where(values.isna(), values.map(str))
    return frame


def _text(frame: pd.DataFrame, column: str) -> pd.Series:
    """A text column with missing values and empty strings as None."""
    if column not in frame.columns:
        return pd.Series([None] * len(frame), index=frame.index, dtype=object)
    values = frame[column].astype(object)
    present = values.notna() & (values.astype(str) != "")
    return pd.Series(
        [value if keep else None for value, keep in zip(values, present, strict=True)],
        index=frame.index,
        dtype=object,
    )


class _Problems:
    def __init__(self, source: str, lines: Sequence[int] | None) -> None:
        self.source = source
        self.lines = lines
        self.found: list[Problem] = []

    def where(self, rows: pd.Index) -> str:
        """The rows' entry: their lines in a CSV or JSON-lines file, else their rows
        (from 1)."""
        return rows_entry(rows, self.lines)

    def rows(self, field: str, rows: pd.Index, message: str, severity: str = "error") -> None:
        if len(rows):
            self.found.append(
                Problem(
                    source=self.source,
                    field=field,
                    entry=self.where(rows),
                    message=f"{len(rows)} {message}",
                    severity=severity,
                )
            )

    def line(self, field: str, message: str, severity: str = "error") -> None:
        self.found.append(
            Problem(source=self.source, field=field, message=message, severity=severity)
        )


def _value_problems(frame: pd.DataFrame, ts: pd.Series, found: _Problems) -> None:
    for message, rows in unread_times(frame["ts"], ts):
        found.rows("ts", rows, message)
    valid = ts.dropna()
    found.rows(
        "ts",
        valid.index[valid.diff() < pd.Timedelta(0)],
        f"events earlier than the {'row' if found.lines is None else 'line'} before"
        " (not in time order)",
    )
    kind = _text(frame, "kind")
    found.rows(
        "kind",
        frame.index[~kind.isin(KINDS)],
        f"unknown kinds (expected {' or '.join(KINDS)})",
    )
    trigger, tenant = _text(frame, "trigger"), _text(frame, "tenant")
    found.rows(
        "trigger",
        frame.index[(kind == "pipeline") & trigger.isna()],
        "pipeline events without a trigger",
    )
    found.rows(
        "tenant", frame.index[(kind == "login") & tenant.isna()], "login events without a tenant"
    )
    ids = _text(frame, "event_id")
    found.rows("event_id", frame.index[ids.isna()], "events without an id")
    named = ids.dropna().astype(str)
    found.rows(
        "event_id",
        named.index[~named.map(lambda text: EVENT_ID.match(text) is not None)],
        "ids that are not valid (letters, digits and ._:-, at most 128)",
    )
    repeated = named[named.duplicated(keep=False)]
    if len(repeated):
        shown = ", ".join(repr(x) for x in repeated.unique()[:_SHOW])
        where = found.where(repeated.index)
        found.line("event_id", f"{repeated.nunique()} ids used more than once ({shown}) in {where}")


def _name_problems(frame: pd.DataFrame, known: KnownNames, found: _Problems) -> None:
    kind, trigger, tenant = _text(frame, "kind"), _text(frame, "trigger"), _text(frame, "tenant")
    if known.triggers is not None:
        unknown = trigger[(kind == "pipeline") & trigger.notna() & ~trigger.isin(known.triggers)]
        for name, count in unknown.value_counts().items():
            rows = found.where(unknown.index[unknown == name])
            found.line(
                "trigger", f"trigger {name!r} is not in pipelines.yaml ({_events(count)}, {rows})"
            )
    if known.tenants is not None:
        unknown = tenant[tenant.notna() & ~tenant.isin(known.tenants)]
        for name, count in unknown.value_counts().items():
            rows = found.where(unknown.index[unknown == name])
            found.line(
                "tenant",
                f"tenant {name!r} is neither in the catalog nor in pipelines.yaml's logins"
                f" ({_events(count)}, {rows})",
            )


def _span_problems(ts: pd.Series, known: KnownNames, found: _Problems) -> None:
    if known.span is None:
        return
    first, last = known.span
    for rows, where, moment in (
        (ts.index[ts < first], "before the request log's first request", first),
        (ts.index[ts > last], "after the request log's last request", last),
    ):
        found.rows(
            "ts",
            rows,
            f"events {where} ({moment.isoformat()}): a replay never delivers them",
            severity="warning",
        )


def problems_in(
    frame: pd.DataFrame, source: str, known: KnownNames, *, lines: Sequence[int] | None = None
) -> list[Problem]:
    """Every problem of a raw event frame; events outside the span are warnings.
    ``lines``: each row's line in its file (CSV, JSON lines), named instead of a row."""
    frame = frame.reset_index(drop=True)
    found = _Problems(source, lines)
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    for column in missing:
        columns = ", ".join(map(str, frame.columns))
        found.line(column, f"missing required column {column!r} (columns: {columns})")
    if missing:
        return found.found
    ts = parse_ts(frame["ts"])
    _value_problems(frame, ts, found)
    _name_problems(frame, known, found)
    _span_problems(ts, known, found)
    return found.found


def check_events(path: str | os.PathLike[str], known: KnownNames | None = None) -> list[Problem]:
    """Every problem in an event log file, strictly: for ``lorafleet validate``."""
    source = Path(path)
    try:
        frame, lines = _read(source)
    except InputError as exc:
        return list(exc.problems)
    return problems_in(frame, str(source), known or KnownNames(), lines=lines)


def load_events(path: str | os.PathLike[str], known: KnownNames | None = None) -> EventLog:
    """Read an event log; InputError lists every error (warnings do not stop it)."""
    source = Path(path)
    frame, lines = _read(source)
    frame = frame.reset_index(drop=True)
    problems = problems_in(frame, str(source), known or KnownNames(), lines=lines)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise InputError(errors)
    columns = {
        "ts": parse_ts(frame["ts"]),
        **{name: _text(frame, name) for name in EVENT_COLUMNS if name != "ts"},
    }
    return EventLog(frame=pd.DataFrame(columns), source=str(source))


def write_events(frame: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write an event log (Parquet, CSV or JSON lines by suffix), atomically."""
    target = Path(path)
    suffix = target.suffix.lower()
    frame = frame.loc[:, list(EVENT_COLUMNS)]
    if suffix == ".csv":
        write_through(
            target,
            lambda out: frame.to_csv(out, index=False, date_format="%Y-%m-%dT%H:%M:%S.%fZ"),
        )
    elif suffix in (".jsonl", ".ndjson"):
        write_through(
            target,
            lambda out: frame.to_json(out, orient="records", lines=True, date_format="iso"),
        )
    elif suffix == ".parquet":
        stamped = frame.assign(ts=frame["ts"].astype("datetime64[ms, UTC]"))
        write_through(target, lambda out: stamped.to_parquet(out, index=False))
    else:
        raise InputError(
            [Problem(source=str(target), message="unknown format: use .parquet, .csv or .jsonl")]
        )


def check_events_against(
    path: str | os.PathLike[str],
    *,
    catalog: str | os.PathLike[str],
    fleet: str | os.PathLike[str],
    pipelines: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
) -> list[Problem]:
    """``check_events`` against the names of the other inputs, as far as they parse
    (their own problems are ``validate_inputs``'s to report): triggers are checked
    only with a pipelines.yaml, the span only with a request log that reads."""
    parsed_fleet = _quietly(lambda: parse_fleet(Path(fleet))[0])
    parsed_catalog = _quietly(lambda: parse_catalog(Path(catalog), parsed_fleet)[0])
    parsed_pipelines = (
        _quietly(lambda: parse_pipelines(Path(pipelines), parsed_catalog)[0])
        if pipelines is not None
        else None
    )
    requests = (
        _quietly(lambda: load_request_log(Path(log)).frame["ts"]) if log is not None else None
    )
    known = known_names(catalog=parsed_catalog, pipelines=parsed_pipelines, requests_ts=requests)
    problems = check_events(path, known)
    if pipelines is None:
        problems.append(
            Problem(
                source=str(path),
                field="trigger",
                message="pipeline triggers not checked: give --pipelines",
                severity="warning",
            )
        )
    return problems


def _quietly(read: Callable[[], _T]) -> _T | None:
    try:
        return read()
    except InputError:
        return None
