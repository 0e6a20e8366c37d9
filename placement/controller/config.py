"""controller.yaml: the controller's typed configuration, parsed once at the edge.

Every mistake is reported at once, each as a ``Problem`` naming the file and the
field (``kubernetes.namespace: Field required``); relative paths are resolved
against the file's directory. Reads the file only; wiring is the CLI's.

```yaml
catalog: catalog.yaml
fleet: fleet.yaml                 # on Kubernetes: per pool, the budgets of its pods
pipelines: pipelines.yaml         # optional
history:
  log: requests.parquet           # or prometheus_url: http://prometheus:9090
  live_log: router-requests.jsonl # optional: the router's log, added at each ingest
state_dir: ./state                # without kubernetes: plans and ledger live here
kubernetes:                       # optional: discover pods, ConfigMaps, Lease
  namespace: lorafleet
  selector: app.kubernetes.io/component=lora-server
webhook:
  port: 8080
  secret_file: /var/run/secrets/lorafleet/webhook-secret
intervals: {ingest_s: 300, forecast_s: 900, plan_s: 300, watchdog_s: 15}
planner: {replicate_share: 0.02, default_hot_replicas: 2, max_loads_per_pod: 8,
          validity_s: 3600, time_limit_s: 10}
max_loads_per_event: 2
forecast_model: level-profile     # a models/ forecaster, or same-hour
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from models.registry import forecaster_named
from placement.errors import InputError, Problem

#: The forecaster that needs no fitting (``placement.controller.live_ports.SeasonalForecaster``).
SAME_HOUR_MODEL = "same-hour"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HistoryConfig(_Section):
    log: Path | None = None
    prometheus_url: str | None = None
    lookback_days: int = Field(default=14, ge=1, le=90)
    #: The router's request log (JSON lines or Parquet), added to ``log`` at each ingest;
    #: missing or unreadable counts as empty (the router may not have written yet).
    live_log: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> HistoryConfig:
        if (self.log is None) == (self.prometheus_url is None):
            raise ValueError("give exactly one of log or prometheus_url")
        return self


class KubernetesConfig(_Section):
    namespace: str = Field(min_length=1, max_length=63)
    selector: str = "app.kubernetes.io/component=lora-server"
    pool_label: str = "lorafleet.io/pool"
    default_pool: str | None = None
    port_name: str = "http"
    default_port: int = Field(default=8000, ge=1, le=65535)
    plan_configmap: str = "lorafleet-plan"
    state_configmap: str = "lorafleet-state"
    lease_name: str = "lorafleet-controller"
    #: An API server URL (a proxy, a test server); else in-cluster or kubeconfig.
    api_host: str | None = None


class WebhookConfig(_Section):
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=1, le=65535)
    #: The mounted Secret's file; else the environment variable ``secret_env``.
    secret_file: Path | None = None
    secret_env: str = "LORAFLEET_WEBHOOK_SECRET"


class ClockConfig(_Section):
    """A warped clock for demos: reads ``start`` at wall time ``origin_s`` (default: at
    start-up) and runs ``speed`` times faster. Intervals stay in wall seconds."""

    start: AwareDatetime
    speed: float = Field(default=1.0, gt=0)
    origin_s: float | None = None


class PlannerConfig(_Section):
    """The planner settings an operator tunes (``PlannerSettings`` has the rest)."""

    #: Adapters above this share of traffic get ``default_hot_replicas`` (seed 001);
    #: 1.0 turns availability replicas off (a fleet where pods do not fail, a replay).
    replicate_share: float = Field(default=0.02, gt=0, le=1)
    default_hot_replicas: int = Field(default=2, ge=1, le=64)
    max_loads_per_pod: int = Field(default=8, ge=1)
    validity_s: int = Field(default=3600, ge=60)
    time_limit_s: float = Field(default=10.0, gt=0, le=600)


class IntervalsConfig(_Section):
    ingest_s: int = Field(default=300, ge=1)
    forecast_s: int = Field(default=900, ge=1)
    plan_s: int = Field(default=300, ge=1)
    watchdog_s: int = Field(default=15, ge=1)


class ControllerConfig(_Section):
    catalog: Path
    fleet: Path
    pipelines: Path | None = None
    history: HistoryConfig
    state_dir: Path | None = None
    kubernetes: KubernetesConfig | None = None
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    clock: ClockConfig | None = None
    intervals: IntervalsConfig = Field(default_factory=IntervalsConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    max_loads_per_event: int = Field(default=2, ge=0, le=64)
    #: A forecaster of ``models/`` by name (``level-profile``, ``global-gbm``, ``auto``,
    #: ...), or ``same-hour``: the same window of the last 7 days, with no fitting.
    forecast_model: str = "level-profile"
    #: Learn pipeline transitions and login habits from a per-request log at each ingest.
    learn_events: bool = True
    lease_duration_s: int = Field(default=15, ge=3)
    #: The lease holder's name; the entry point defaults it to the pod's name.
    identity: str | None = None

    @model_validator(mode="after")
    def _where_state_lives(self) -> ControllerConfig:
        if self.kubernetes is None and self.state_dir is None:
            raise ValueError("without a kubernetes section, state_dir is required")
        return self


def _resolve(config: ControllerConfig, base: Path) -> ControllerConfig:
    def at(path: Path | None) -> Path | None:
        return None if path is None or path.is_absolute() else base / path

    history = config.history
    for name in ("log", "live_log"):
        path = getattr(history, name)
        if path is not None and not path.is_absolute():
            history = history.model_copy(update={name: base / path})
    webhook = config.webhook
    if webhook.secret_file is not None and not webhook.secret_file.is_absolute():
        webhook = webhook.model_copy(update={"secret_file": base / webhook.secret_file})
    updates: dict[str, Any] = {"history": history, "webhook": webhook}
    for name in ("catalog", "fleet", "pipelines", "state_dir"):
        resolved = at(getattr(config, name))
        if resolved is not None:
            updates[name] = resolved
    return config.model_copy(update=updates)


def load_controller_config(path: str | Path) -> ControllerConfig:
    """Parse controller.yaml; InputError lists every problem with its field."""
    source = Path(path)
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([Problem(source=str(source), message="no such file")]) from None
    except (OSError, yaml.YAMLError) as exc:
        raise InputError([Problem(source=str(source), message=f"cannot read: {exc}")]) from None
    if not isinstance(raw, dict):
        raise InputError([Problem(source=str(source), message="expected a mapping at the top")])
    try:
        config = ControllerConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [
            Problem(
                source=str(source),
                field=".".join(str(part) for part in error["loc"]) or None,
                message=error["msg"],
            )
            for error in exc.errors(include_url=False)
        ]
        raise InputError(problems) from None
    if config.forecast_model != SAME_HOUR_MODEL:
        try:
            forecaster_named(config.forecast_model)
        except KeyError as exc:
            raise InputError(
                [Problem(source=str(source), field="forecast_model", message=str(exc.args[0]))]
            ) from None
    return _resolve(config, source.parent)


def read_secret(config: WebhookConfig, environ: dict[str, str]) -> bytes | None:
    """The webhook secret from the mounted file, else from the environment; None when
    neither is set (the webhook is then off). A named file that is unreadable or empty
    is a mistake, not a way to turn it off."""
    if config.secret_file is None:
        return environ.get(config.secret_env, "").encode() or None
    try:
        secret = config.secret_file.read_bytes().strip()
    except OSError as exc:
        raise InputError(
            [Problem(source=str(config.secret_file), message=f"cannot read the secret: {exc}")]
        ) from None
    if not secret:
        raise InputError(
            [Problem(source=str(config.secret_file), message="the webhook secret is empty")]
        )
    return secret
