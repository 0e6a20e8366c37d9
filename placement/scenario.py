"""Read ``scenario.yaml``: the workload a synthetic log is generated from.

A scenario lives in a folder beside its ``catalog.yaml``, ``fleet.yaml`` and, where it
has pipelines, ``pipelines.yaml``; ``ScenarioFiles`` finds them. Errors name the file
and the field, like every other input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from placement.domain import AdapterId, TenantId
from placement.errors import InputError, Problem
from placement.synth import Experiment, Login, Scenario


@dataclass(frozen=True, kw_only=True)
class ScenarioFiles:
    scenario: Scenario
    folder: Path
    catalog: Path
    fleet: Path
    pipelines: Path | None
    log: Path


def _time_in(timezone: str) -> Any:
    """A converter for times: an offset wins; a bare local time is in the scenario's zone."""

    def convert(value: Any) -> datetime:
        text = value.isoformat() if isinstance(value, datetime) else str(value)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=ZoneInfo(timezone))
        return moment.astimezone(UTC)

    return convert


def _hours(value: Any) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"expected [start_hour, end_hour], got {value!r}")
    start, end = (float(v) for v in value)
    if not 0 <= start < end <= 24:
        raise ValueError(f"expected 0 <= start < end <= 24, got {value!r}")
    return start, end


def _parse(raw: dict[str, Any], problems: list[Problem], source: str) -> Scenario | None:
    def field(
        key: str,
        convert: Any,
        default: Any = None,
        *,
        entry: str | None = None,
        within: dict[str, Any] | None = None,
    ) -> Any:
        container = raw if within is None else within
        if key not in container or container[key] is None:
            if default is None:
                problems.append(
                    Problem(source=source, entry=entry, field=key, message="is required")
                )
            return default
        try:
            return convert(container[key])
        except (TypeError, ValueError) as exc:
            problems.append(Problem(source=source, entry=entry, field=key, message=str(exc)))
            return default

    time = _time_in(str(raw.get("timezone", "UTC")))
    overrides = raw.get("adapters") or {}
    weights = {
        AdapterId(k): float(v["weight"])
        for k, v in overrides.items()
        if isinstance(v, dict) and "weight" in v
    }
    hours = {
        AdapterId(k): _hours(v["business_hours"])
        for k, v in overrides.items()
        if isinstance(v, dict) and "business_hours" in v
    }
    experiments = tuple(
        Experiment(
            start=field("start", time, entry=f"experiments[{i}]", within=e),
            of_top=int(e.get("of_top", 20)),
            suffix=str(e.get("suffix", "-experiment")),
            split=float(e.get("split", 0.5)),
        )
        for i, e in enumerate(raw.get("experiments") or [])
    )
    logins = tuple(
        Login(
            tenant=TenantId(str(entry["tenant"])),
            at_local=str(entry["at_local"]),
            requests=int(entry.get("requests", 30)),
            duration_s=float(entry.get("duration_s", 1800)),
        )
        for entry in raw.get("logins") or []
    )
    sessions = raw.get("sessions") or {}
    tokens = raw.get("tokens") or {}
    start = field("start", time)
    if start is None or problems:
        return None
    return Scenario(
        name=str(raw.get("name", "scenario")),
        start=start,
        days=float(raw.get("days", 1)),
        requests_per_minute=field("requests_per_minute", float, 60.0),
        zipf_exponent=float(raw.get("zipf_exponent", 1.1)),
        interarrival_cv=float(raw.get("interarrival_cv", 1.5)),
        timezone=str(raw.get("timezone", "UTC")),
        business_hours=field("business_hours", _hours, (9.0, 18.0)),
        night_level=float(raw.get("night_level", 0.15)),
        weekend_level=float(raw.get("weekend_level", 0.3)),
        weights=weights,
        hours=hours,
        session_mean_requests=float(sessions.get("mean_requests", 1.0)),
        session_gap_s=float(sessions.get("gap_s", 20.0)),
        pipelines_per_hour={
            str(k): float(v) for k, v in (raw.get("pipelines_per_hour") or {}).items()
        },
        logins=logins,
        experiments=experiments,
        prompt_median=float(tokens.get("prompt_median", 1020)),
        prompt_sigma=float(tokens.get("prompt_sigma", 0.9)),
        output_median=float(tokens.get("output_median", 129)),
        output_sigma=float(tokens.get("output_sigma", 1.0)),
    )


def load_scenario(path: str | os.PathLike[str]) -> ScenarioFiles:
    """Read a scenario file and locate its companion files."""
    source = Path(path)
    try:
        raw = yaml.safe_load(source.read_text())
    except OSError as exc:
        raise InputError(
            [Problem(source=str(source), message=f"cannot read: {exc.strerror}")]
        ) from None
    except yaml.YAMLError as exc:
        raise InputError([Problem(source=str(source), message=f"not valid YAML: {exc}")]) from None
    if not isinstance(raw, dict):
        raise InputError([Problem(source=str(source), message="expected a mapping")])
    problems: list[Problem] = []
    try:
        scenario = _parse(raw, problems, str(source))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problems.append(Problem(source=str(source), message=f"malformed entry: {exc}"))
        scenario = None
    folder = source.parent
    files = {key: folder / str(raw.get(key, f"{key}.yaml")) for key in ("catalog", "fleet")}
    for key, file in files.items():
        if not file.is_file():
            problems.append(
                Problem(source=str(source), field=key, message=f"{file} does not exist")
            )
    pipelines = folder / str(raw.get("pipelines", "pipelines.yaml"))
    if problems or scenario is None:
        raise InputError(problems)
    return ScenarioFiles(
        scenario=scenario,
        folder=folder,
        catalog=files["catalog"],
        fleet=files["fleet"],
        pipelines=pipelines if pipelines.is_file() else None,
        log=folder / str(raw.get("log", "requests.parquet")),
    )
