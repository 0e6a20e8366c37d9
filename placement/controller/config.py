"""controller.yaml: the controller's typed configuration, parsed once at the edge.

Every mistake is reported at once, each as a ``Problem`` naming the file and the
field (``kubernetes.namespace: Field required``); relative paths are resolved
against the file's directory. Reads the file only; wiring is the CLI's.

```yaml
catalog: catalog.yaml             # or kubernetes.catalog_configmap: re-read on change
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
  source_header: X-Forwarded-For  # optional: only behind a proxy that sets it
  rate_per_s: 20                  # optional: each source's rate, and its burst
  burst: 40
intervals: {plan_s: 120}          # optional: ingest_s, forecast_s, plan_s, watchdog_s
inputs: {adapter_roots: [/adapters], adapter_schemes: [s3, gs]}   # optional
inputs: {adapter_source_template: "s3://adapters/{name}"}         # optional: see below
planner: {replicate_share: 1.0}   # optional: the PlannerSettings an operator tunes
max_loads_per_event: 4            # optional
forecast_model: level-profile     # a models/ forecaster, or same-hour
```

The tuning fields (``intervals``, ``planner``, ``inputs``, ``max_loads_per_event``,
the lease timings, ``api_timeout_s``, the webhook's ``source_header``,
``trusted_hops``, ``rate_per_s`` and ``burst``) default to None, "not set":
``ControllerConfig.override`` lays the ones a file sets over the settings tree, which
holds the only defaults. The lease
timings are checked together, as client-go checks them: the API timeout is shorter
than the renew deadline, which is shorter than the lease.

With ``inputs.adapter_source_template`` set, an adapter the traffic names but the
catalog lacks is planned at the next forecast, loaded from the template's source
(``placement.controller.surprises``); the catalog file itself is re-read whenever
it changes, without a restart.

The webhook secret (``read_secret``) must be at least 32 bytes and not the
placeholder ``deploy/base/webhook-secret.yaml`` ships: the controller refuses to start
on either, rather than accept events anyone could sign.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

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
from placement.inputs.catalog import as_adapter_class
from placement.inputs.fields import parse_yaml, validation_problems
from placement.inputs.files import read_text
from placement.inputs.sources import check_source_template
from placement.settings import ControllerSettings, InputSettings, Settings

#: The value ``deploy/base/webhook-secret.yaml`` ships, to be replaced in an overlay.
PLACEHOLDER_SECRET = b"replace-me-with-a-random-32-byte-value"
MIN_SECRET_BYTES = 32

#: The forecaster that needs no fitting (``placement.controller.live_ports.SeasonalForecaster``).
SAME_HOUR_MODEL = "same-hour"


class _Section(BaseModel):
    # A NaN or an infinity is refused as such (not "should be less than 600").
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    hot_sets_configmap: str = "lorafleet-hot-sets"
    lease_name: str = "lorafleet-controller"
    #: Read the catalog from this ConfigMap's ``catalog_key`` (re-read when its
    #: resourceVersion changes) instead of the ``catalog`` file; the Role must grant
    #: get on it.
    catalog_configmap: str | None = Field(default=None, min_length=1, max_length=253)
    catalog_key: str = "catalog.yaml"
    #: An API server URL (a proxy, a test server); else in-cluster or kubeconfig.
    api_host: str | None = None


class WebhookConfig(_Section):
    host: str = "0.0.0.0"
    #: 0: any free port (tests); the log's "Uvicorn running on" line says which.
    port: int = Field(default=8080, ge=0, le=65535)
    #: The mounted Secret's file; else the environment variable ``secret_env``.
    secret_file: Path | None = None
    secret_env: str = "LORAFLEET_WEBHOOK_SECRET"
    #: The header a trusted proxy puts the sender's address in (X-Forwarded-For); set
    #: it only when every request comes through such a proxy. None: the peer address.
    source_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    trusted_hops: int | None = Field(default=None, ge=1, le=16)
    #: Each source's token bucket: refill rate and size (None: the settings tree's).
    rate_per_s: float | None = Field(default=None, gt=0)
    burst: float | None = Field(default=None, ge=1)


class ClockConfig(_Section):
    """A warped clock for demos: reads ``start`` at wall time ``origin_s`` (default: at
    start-up) and runs ``speed`` times faster. Intervals stay in wall seconds."""

    start: AwareDatetime
    speed: float = Field(default=1.0, gt=0)
    origin_s: float | None = None


class PlannerConfig(_Section):
    """The planner settings an operator tunes, each None unless set (``PlannerSettings``
    has their defaults, and the rest)."""

    #: Adapters above this share of traffic get ``default_hot_replicas``;
    #: 1.0 turns availability replicas off (a fleet where pods do not fail, a replay).
    replicate_share: float | None = Field(default=None, gt=0, le=1)
    default_hot_replicas: int | None = Field(default=None, ge=1, le=64)
    max_loads_per_pod: int | None = Field(default=None, ge=1)
    validity_s: int | None = Field(default=None, ge=60)
    time_limit_s: float | None = Field(default=None, gt=0, le=600)


class IntervalsConfig(_Section):
    """Each job's period, None unless set (``ControllerSettings`` has the defaults)."""

    ingest_s: int | None = Field(default=None, ge=1)
    forecast_s: int | None = Field(default=None, ge=1)
    plan_s: int | None = Field(default=None, ge=1)
    watchdog_s: int | None = Field(default=None, ge=1)


class InputsConfig(_Section):
    """What catalog sources may be, and where an adapter the catalog lacks is loaded
    from (``InputSettings``), each None unless set. The template is checked here: it
    holds ``{name}`` and gives a source the roots and schemes allow."""

    adapter_roots: tuple[str, ...] | None = None
    adapter_schemes: tuple[str, ...] | None = None
    adapter_source_template: str | None = None
    unannounced_rank: int | None = Field(default=None, ge=1)
    unannounced_size_bytes: int | None = Field(default=None, ge=1)
    unannounced_class: str | None = None
    unannounced_max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _template_and_class(self) -> InputsConfig:
        rules = replace(InputSettings(), **self.model_dump(exclude_none=True))
        if rules.adapter_source_template is not None:
            try:
                check_source_template(rules.adapter_source_template, rules=rules)
            except ValueError as exc:
                raise ValueError(f"adapter_source_template: {exc}") from None
        as_adapter_class(rules.unannounced_class)  # ValueError naming the classes
        return self


class ControllerConfig(_Section):
    #: The catalog file; or, on Kubernetes, ``kubernetes.catalog_configmap``.
    catalog: Path | None = None
    fleet: Path
    pipelines: Path | None = None
    history: HistoryConfig
    state_dir: Path | None = None
    kubernetes: KubernetesConfig | None = None
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    clock: ClockConfig | None = None
    intervals: IntervalsConfig = Field(default_factory=IntervalsConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    max_loads_per_event: int | None = Field(default=None, ge=0, le=64)
    #: A forecaster of ``models/`` by name (``level-profile``, ``global-gbm``, ``auto``,
    #: ...), or ``same-hour``: the same window of the last 7 days, with no fitting.
    #: ``level-profile``, not ``lorafleet forecast``'s ``auto``: behind the plan, auto made
    #: 2% more loads on ServeGen m-mid in twice the time, and persistence did as well as
    #: level-profile (docs/benchmarks.md, "the plan's forecaster and the load's weight").
    forecast_model: str = "level-profile"
    #: Learn pipeline transitions and login habits from a per-request log at each ingest.
    learn_events: bool = True
    lease_duration_s: int | None = Field(default=None, ge=3)
    lease_renew_deadline_s: float | None = Field(default=None, gt=0)
    lease_retry_period_s: float | None = Field(default=None, gt=0)
    api_timeout_s: float | None = Field(default=None, gt=0)
    inputs: InputsConfig = Field(default_factory=InputsConfig)
    #: The lease holder's name; the entry point defaults it to the pod's name.
    identity: str | None = None

    def override(self, settings: Settings) -> Settings:
        """``settings`` with every field this file sets; the ones it leaves out keep
        their values there."""
        intervals = self.intervals
        controller: dict[str, Any] = {
            "ingest_interval_s": intervals.ingest_s,
            "forecast_interval_s": intervals.forecast_s,
            "plan_interval_s": intervals.plan_s,
            "watchdog_interval_s": intervals.watchdog_s,
            "max_loads_per_event": self.max_loads_per_event,
            "lease_duration_s": self.lease_duration_s,
            "lease_renew_deadline_s": self.lease_renew_deadline_s,
            "lease_retry_period_s": self.lease_retry_period_s,
            "api_timeout_s": self.api_timeout_s,
            "webhook_source_header": self.webhook.source_header,
            "webhook_trusted_hops": self.webhook.trusted_hops,
            "webhook_rate_per_s": self.webhook.rate_per_s,
            "webhook_burst": self.webhook.burst,
        }
        set_fields = {name: value for name, value in controller.items() if value is not None}
        return replace(
            settings,
            controller=replace(settings.controller, **set_fields),
            planner=replace(settings.planner, **self.planner.model_dump(exclude_none=True)),
            inputs=replace(settings.inputs, **self.inputs.model_dump(exclude_none=True)),
        )

    @model_validator(mode="after")
    def _where_state_lives(self) -> ControllerConfig:
        if self.kubernetes is None and self.state_dir is None:
            raise ValueError("without a kubernetes section, state_dir is required")
        in_configmap = self.kubernetes is not None and self.kubernetes.catalog_configmap
        if (self.catalog is None) == (not in_configmap):
            raise ValueError("give exactly one of catalog or kubernetes.catalog_configmap")
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
    raw = parse_yaml(read_text(source), source=str(source))
    if not isinstance(raw, dict):
        raise InputError([Problem(source=str(source), message="expected a mapping at the top")])
    try:
        config = ControllerConfig.model_validate(raw)
    except ValidationError as exc:
        raise InputError(validation_problems(exc, source=str(source))) from None
    if config.forecast_model != SAME_HOUR_MODEL:
        try:
            forecaster_named(config.forecast_model)
        except KeyError as exc:
            raise InputError(
                [Problem(source=str(source), field="forecast_model", message=str(exc.args[0]))]
            ) from None
    problem = lease_timing_problem(config.override(Settings()).controller)
    if problem is not None:
        raise InputError([Problem(source=str(source), message=problem)])
    return _resolve(config, source.parent)


def lease_timing_problem(settings: ControllerSettings) -> str | None:
    """Why these lease timings cannot fence writes, or None when they can: a write must
    end (API timeout) before the renew deadline, which must pass before the lease does,
    with room for at least one renewal attempt in between."""
    timeout_s, deadline_s = settings.api_timeout_s, settings.lease_renew_deadline_s
    retry_s, lease_s = settings.lease_retry_period_s, settings.lease_duration_s
    if not timeout_s < deadline_s < lease_s:
        return (
            f"api_timeout_s ({timeout_s}) < lease_renew_deadline_s ({deadline_s}) < "
            f"lease_duration_s ({lease_s}) must hold"
        )
    if not retry_s < deadline_s:
        return f"lease_retry_period_s ({retry_s}) must be shorter than lease_renew_deadline_s"
    return None


def secret_problem(secret: bytes) -> str | None:
    """Why ``secret`` cannot sign webhook events, or None when it can."""
    if secret == PLACEHOLDER_SECRET:
        return "the webhook secret is the placeholder deploy/base ships: set a random one"
    if len(secret) < MIN_SECRET_BYTES:
        return (
            f"the webhook secret has {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
            "random bytes (openssl rand -hex 32)"
        )
    if len(set(secret)) == 1:
        return "the webhook secret is one byte repeated: use random bytes"
    return None


def read_secret(config: WebhookConfig, environ: dict[str, str]) -> bytes | None:
    """The webhook secret from the mounted file, else from the environment; None when
    neither is set (the webhook is then off). Surrounding whitespace (a file's last
    newline) is not part of it. A secret that is set but empty, short or the shipped
    placeholder is an InputError: the controller refuses to start."""
    if config.secret_file is None:
        where = f"${config.secret_env}"
        secret = environ.get(config.secret_env, "").encode().strip()
        if config.secret_env not in environ:
            return None
    else:
        where = str(config.secret_file)
        try:
            secret = config.secret_file.read_bytes().strip()
        except OSError as exc:
            raise InputError(
                [Problem(source=where, message=f"cannot read the secret: {exc}")]
            ) from None
    if not secret:
        raise InputError([Problem(source=where, message="the webhook secret is empty")])
    problem = secret_problem(secret)
    if problem is not None:
        raise InputError([Problem(source=where, message=problem)])
    return secret
