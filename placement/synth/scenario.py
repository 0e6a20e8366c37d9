"""Read ``scenario.yaml``: the workload a synthetic log is generated from.

A scenario lives in a folder beside its ``catalog.yaml``, ``fleet.yaml`` and, where it
has pipelines, ``pipelines.yaml``; ``ScenarioFiles`` finds them. The file is validated
once against the models below; every mistake is reported, each naming the file and the
field (``experiments.0.start: ...``), like every other input. Reads the file only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from placement.domain import AdapterId, TenantId
from placement.errors import InputError, Problem
from placement.inputs.fields import read_yaml, validation_problems
from placement.synth.model import Experiment, Login, Scenario


@dataclass(frozen=True, kw_only=True)
class ScenarioFiles:
    scenario: Scenario
    folder: Path
    catalog: Path
    fleet: Path
    pipelines: Path | None
    log: Path
    #: Where ``lorafleet synth`` writes the event log beside ``log``.
    events: Path


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Hours = tuple[float, float]


def _check_hours(value: Hours) -> Hours:
    if not 0 <= value[0] < value[1] <= 24:
        raise ValueError(f"expected 0 <= start < end <= 24, got {list(value)}")
    return value


class AdapterOverride(_Section):
    weight: float | None = Field(default=None, gt=0)
    business_hours: Hours | None = None

    _hours = field_validator("business_hours")(lambda v: v if v is None else _check_hours(v))


class ExperimentSpec(_Section):
    start: datetime
    of_top: int = Field(default=20, ge=1)
    suffix: str = "-experiment"
    split: float = Field(default=0.5, ge=0, le=1)
    traffic_increase: float = Field(default=0.0, ge=0)


class LoginSpec(_Section):
    tenant: str
    at_local: str = Field(pattern=r"^\d{1,2}:\d{2}$")
    requests: int = Field(default=30, ge=1)
    duration_s: float = Field(default=1800, gt=0)
    per_login: int = Field(default=3, ge=1)


class SessionSpec(_Section):
    mean_requests: float = Field(default=1.0, ge=1)
    gap_s: float = Field(default=20.0, gt=0)


class TokenSpec(_Section):
    prompt_median: float = Field(default=1020, gt=0)
    prompt_sigma: float = Field(default=0.9, ge=0)
    output_median: float = Field(default=129, gt=0)
    output_sigma: float = Field(default=1.0, ge=0)


class ScenarioFile(_Section):
    """The shape of ``scenario.yaml`` (docs/formats.md shows one)."""

    name: str = "scenario"
    catalog: str = "catalog.yaml"
    fleet: str = "fleet.yaml"
    pipelines: str = "pipelines.yaml"
    log: str = "requests.parquet"
    events: str = "events.parquet"
    start: datetime
    days: float = Field(default=1.0, gt=0)
    timezone: str = "UTC"
    requests_per_minute: float = Field(default=60.0, gt=0)
    zipf_exponent: float = Field(default=1.1, ge=0)
    interarrival_cv: float = Field(default=1.5, gt=0)
    business_hours: Hours = (9.0, 18.0)
    night_level: float = Field(default=0.15, ge=0, le=1)
    weekend_level: float = Field(default=0.3, ge=0)
    profile: list[tuple[float, float]] = Field(default_factory=list)
    adapters: dict[str, AdapterOverride] = Field(default_factory=dict)
    sessions: SessionSpec = Field(default_factory=SessionSpec)
    pipelines_per_hour: dict[str, float] = Field(default_factory=dict)
    logins: list[LoginSpec] = Field(default_factory=list)
    experiments: list[ExperimentSpec] = Field(default_factory=list)
    tokens: TokenSpec = Field(default_factory=TokenSpec)

    _hours = field_validator("business_hours")(_check_hours)

    @field_validator("profile")
    @classmethod
    def _daily_curve(cls, value: list[tuple[float, float]]) -> list[tuple[float, float]]:
        hours = [hour for hour, _ in value]
        if any(not 0 <= hour < 24 for hour in hours) or len(set(hours)) != len(hours):
            raise ValueError("expected [hour, level] points with distinct hours in [0, 24)")
        if any(level < 0 for _, level in value) or (value and max(v for _, v in value) <= 0):
            raise ValueError("expected levels of at least 0, and one above 0")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (an IANA name)") from None
        return value

    def moment(self, value: datetime) -> datetime:
        """An offset wins; a bare local time is in the scenario's zone."""
        local = value if value.tzinfo else value.replace(tzinfo=ZoneInfo(self.timezone))
        return local.astimezone(UTC)

    def to_scenario(self) -> Scenario:
        return Scenario(
            name=self.name,
            start=self.moment(self.start),
            days=self.days,
            requests_per_minute=self.requests_per_minute,
            zipf_exponent=self.zipf_exponent,
            interarrival_cv=self.interarrival_cv,
            timezone=self.timezone,
            business_hours=self.business_hours,
            night_level=self.night_level,
            weekend_level=self.weekend_level,
            profile=tuple((float(hour), float(level)) for hour, level in self.profile),
            weights=MappingProxyType(
                {AdapterId(k): v.weight for k, v in self.adapters.items() if v.weight}
            ),
            hours=MappingProxyType(
                {
                    AdapterId(k): v.business_hours
                    for k, v in self.adapters.items()
                    if v.business_hours
                }
            ),
            session_mean_requests=self.sessions.mean_requests,
            session_gap_s=self.sessions.gap_s,
            pipelines_per_hour=MappingProxyType(dict(self.pipelines_per_hour)),
            logins=tuple(
                Login(
                    tenant=TenantId(x.tenant),
                    at_local=x.at_local,
                    requests=x.requests,
                    duration_s=x.duration_s,
                    per_login=x.per_login,
                )
                for x in self.logins
            ),
            experiments=tuple(
                Experiment(
                    start=self.moment(x.start),
                    of_top=x.of_top,
                    suffix=x.suffix,
                    split=x.split,
                    traffic_increase=x.traffic_increase,
                )
                for x in self.experiments
            ),
            prompt_median=self.tokens.prompt_median,
            prompt_sigma=self.tokens.prompt_sigma,
            output_median=self.tokens.output_median,
            output_sigma=self.tokens.output_sigma,
        )


def load_scenario(path: str | os.PathLike[str]) -> ScenarioFiles:
    """Read a scenario file and locate its companion files; InputError lists every problem."""
    source = Path(path)
    raw = read_yaml(source)  # strict, as catalog.yaml: not UTF-8, twice a key, aliases
    if not isinstance(raw, dict):
        raise InputError([Problem(source=str(source), message="expected a mapping")])
    try:
        spec = ScenarioFile.model_validate(raw)
    except ValidationError as exc:
        raise InputError(validation_problems(exc, source=str(source))) from None
    folder = source.parent
    files = {"catalog": folder / spec.catalog, "fleet": folder / spec.fleet}
    missing = [
        Problem(source=str(source), field=key, message=f"{file} does not exist")
        for key, file in files.items()
        if not file.is_file()
    ]
    if missing:
        raise InputError(missing)
    pipelines = folder / spec.pipelines
    return ScenarioFiles(
        scenario=spec.to_scenario(),
        folder=folder,
        catalog=files["catalog"],
        fleet=files["fleet"],
        pipelines=pipelines if pipelines.is_file() else None,
        log=folder / spec.log,
        events=folder / spec.events,
    )
