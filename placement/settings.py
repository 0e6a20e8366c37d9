"""The one typed settings tree, built at an entry point and passed down.

Nothing else reads the environment or config files for settings. Every constant a
decision uses lives here with the fact behind its default (sources in
docs/background.md), so that replay, the controller and tests can change it in one
place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

MB = 1_000_000

#: How a replayed pod admits requests around a load (``SimSettings.load_admission``).
LoadAdmission = Literal["drain", "vllm"]
#: Its choices, as ``--load-admission`` names them.
LOAD_ADMISSIONS: tuple[LoadAdmission, ...] = ("drain", "vllm")


@dataclass(frozen=True, kw_only=True)
class LoadCostSettings:
    """The five phases of an adapter swap, for a rank-16 adapter of about 50 MB.

    Best case (in host RAM, no drain): dealloc 5 + transfer 3 + init 20 + warm-up 57
    = 85 ms. Worst case (large adapter on NVMe, full 500 ms drain): about 670 ms.
    """

    dealloc_ms: float = 5.0
    #: Effective host-to-GPU bandwidth: 50 MB in about 3 ms over PCIe Gen5.
    host_to_gpu_bytes_per_s: float = 16.7e9
    #: Effective storage-to-host bandwidth: 50 MB in about 10 ms from NVMe.
    storage_to_host_bytes_per_s: float = 5.0e9
    init_ms: float = 20.0
    warmup_ms: float = 57.0
    #: The longest a pod waits for its running batch before weights move.
    max_drain_ms: float = 500.0
    #: The drain a planner expects on a busy pod (half the worst case).
    expected_drain_ms: float = 250.0

    def warm_load_ms(self, size_bytes: int, *, drain_ms: float = 0.0) -> float:
        """Milliseconds to bring an adapter from host RAM onto a GPU slot."""
        transfer_ms = 1000.0 * size_bytes / self.host_to_gpu_bytes_per_s
        return drain_ms + self.dealloc_ms + transfer_ms + self.init_ms + self.warmup_ms

    def cold_load_ms(self, size_bytes: int, *, drain_ms: float = 0.0) -> float:
        """Milliseconds to bring an adapter from storage onto a GPU slot."""
        fetch_ms = 1000.0 * size_bytes / self.storage_to_host_bytes_per_s
        return fetch_ms + self.warm_load_ms(size_bytes, drain_ms=drain_ms)


@dataclass(frozen=True, kw_only=True)
class ForecastSettings:
    bucket_s: int = 600
    horizon_s: int = 24 * 3600
    #: Adapters with fewer buckets of history than this use the simpler models.
    min_history_buckets: int = 144
    quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)
    #: How early before a forecast rise an adapter starts loading (8:45 for a 9:00 peak).
    preload_lead_s: int = 15 * 60


@dataclass(frozen=True, kw_only=True)
class PlannerSettings:
    """What the solver optimises and within which limits."""

    #: A plan is valid this long; loads are amortised over it.
    validity_s: int = 3600
    #: Forecast traffic (q90) routed to a pod stays within capacity_rps times this.
    capacity_headroom: float = 0.85
    #: Adapters above this share of traffic get two replicas by default, so that one pod
    #: failure does not take them offline.
    replicate_share: float = 0.02
    default_hot_replicas: int = 2
    #: At most this many loads per pod in one plan (churn).
    max_loads_per_pod: int = 8
    #: Weight of the load-imbalance term, in ms per (request/s) above the pod mean.
    imbalance_weight: float = 1.0
    #: Hysteresis: an adapter must beat the hot threshold by this factor to be promoted.
    promote_factor: float = 1.25
    demote_factor: float = 0.8
    time_limit_s: float = 10.0
    workers: int = 2
    seed: int = 0
    #: The solver stops once its plan is within this fraction of the best bound.
    gap_limit: float = 0.001
    #: Tenant SLOs: a hot replica's saving counts at this TTFT SLO over the adapter's
    #: catalog ``slo_ttft_ms`` (none: 1), clipped to the range below, so a tighter SLO
    #: keeps its adapter on the GPU first.
    slo_reference_ttft_ms: float = 1000.0
    slo_weight_min: float = 0.5
    slo_weight_max: float = 4.0
    #: The GPU-residency promise: this share of a tenant's adapter-bearing requests is
    #: served by an adapter already on the GPU (``lorafleet review`` reports it).
    gpu_residency_target: float = 0.97
    #: The tail reserve: at most this many GPU slots per pod left to the dynamic cache
    #: for adapters the plan does not place, priced by the forecast's spread against the
    #: planned adapters they would displace (placement.solver.reserve); 0: none.
    tail_reserve_max_slots: int = 0


#: How long any client of the engines (the router's proxy pool and engine calls, the
#: controller's, ``lorafleet apply``'s) reuses an idle connection to a pod at most: below
#: the engines' own keep-alive (vLLM's and SGLang's API servers run uvicorn, which closes
#: an idle connection after 5 s), so that a call is not written on a connection the pod
#: is closing, where it fails unanswered. httpx's own default is 5 s.
ENGINE_KEEPALIVE_S = 4.0


@dataclass(frozen=True, kw_only=True)
class RouterSettings:
    #: How pods are picked: ``plan`` follows the plan (lorafleet); the reactive
    #: baselines ``round-robin``, ``least-loaded``, ``epp`` (llm-d's EPP score) and
    #: ``llm-d`` (its lora-affinity scorer) ignore it, for comparisons on live pods.
    policy: str = "plan"
    scrape_interval_s: float = 0.25
    #: A scrape slower than this counts as a failed health check.
    scrape_timeout_s: float = 1.0
    #: A pod without /metrics (SGLang without --enable-metrics) is judged by /health;
    #: SGLang's runs a one-token generation and answers after a second at the earliest.
    health_timeout_s: float = 5.0
    #: Above this KV use on every candidate, no new loads (soft memory pressure: 85%).
    no_load_kv_usage: float = 0.85
    #: Above this KV use on every candidate, answer 503 with Retry-After (critical: 95%).
    reject_kv_usage: float = 0.95
    hash_replicas: int = 2
    upstream_timeout_s: float = 600.0
    #: A pod that does not accept a connection this fast is skipped (retried elsewhere).
    connect_timeout_s: float = 2.0
    #: An idle upstream connection to a pod is reused this long at most (the proxy's
    #: pool and the router's engine calls: loads, listings): below the engines' own
    #: keep-alive (uvicorn and vLLM close an idle connection after 5 s), so the pool
    #: does not write on a connection the pod has just closed.
    upstream_keepalive_s: float = ENGINE_KEEPALIVE_S
    #: An idle client connection is closed after this long. Above the clients' own
    #: keep-alive (httpx and the OpenAI SDK drop an idle connection after 5 s; nginx
    #: upstreams 60 s, AWS load balancers 60 s), so a client never sends a request on a
    #: connection the router is closing: at uvicorn's 5 s both ends timed out together
    #: and the request failed at the client unseen by the router.
    client_keepalive_s: int = 75
    #: Seconds a client is told to wait in Retry-After when every candidate is full.
    retry_after_s: int = 1
    plan_poll_s: float = 1.0
    pods_poll_s: float = 10.0
    #: Every Nth scrape also reads /v1/models to correct the ledger's registrations.
    listing_every_scrapes: int = 8
    load_timeout_s: float = 60.0
    max_connections: int = 1024
    #: Rows reach the request log this often: a SIGKILL loses at most this much of it.
    log_flush_s: float = 1.0
    #: The JSON-lines request log is renamed aside past this size and a new one begun.
    log_rotate_bytes: int = 64 * 1024 * 1024
    #: Rows waiting for the log writer (a slow or full disk); beyond, dropped and counted.
    max_pending_log_rows: int = 100_000
    #: Seconds one queued request adds to the wait of those behind it (bounded affinity),
    #: until the pool's pods have measured it: then how long the router's requests stay
    #: in flight there over how many the batch holds (``LivePod.wait_per_request_s``,
    #: the pool's median), as the replay prices it (its service time over
    #: ``max_num_seqs``).
    per_request_s: float = 0.05
    #: lorafleet weighs what a load's victim is worth: the chance, by the forecast, that
    #: it is asked for within this long (then reloaded). 60 s over 180 s: fewer loads and
    #: a lower TTFT p95 on the war story, m-mid and deepseek-r1, the same on
    #: legal-research; 30 s loses on deepseek-r1 (docs/benchmarks.md, "Prediction pays").
    victim_horizon_s: float = 60.0
    #: lorafleet weighs what a load stalls on its pod: the pod admits nothing while it
    #: drains and loads, so each request queued there waits the load's time too (the
    #: convoy); a load pays this weight times that per queued request. Off (0): at 1,
    #: the greedy planner's replays made fewer loads on all four traces measured, but
    #: the default CP-SAT planner's made 54 more on legal-research and at most 0.14%
    #: fewer elsewhere (docs/benchmarks.md, "Convoys"). The oracle routes so too.
    load_stall_weight: float = 0.0
    #: Production before experiments: a load's victim is weighed by its catalog
    #: ``class``, and a load on a full pod first sends warm-ups that keep a higher class
    #: off the LRU victim's place while a lower one idles there (router and replay).
    #: Off by default: it trades the lower classes' hits for production's.
    class_priority: bool = False
    #: The live router prices the wait for a GPU slot: a load on a pod where every GPU
    #: slot's adapter has requests running or queued (``policies.route_context.
    #: waits_for_slot``: the last scrape's ``lora_requests_info`` with the router's own
    #: requests in flight) costs ``LoadCostSettings.expected_drain_ms`` more, and a
    #: victim's reload is weighed with it. On, because the engines drain nothing for a
    #: load: vLLM (v1 ``Scheduler.schedule``'s ``max_loras`` check) and current SGLang
    #: (``get_new_batch_prefill``) skip a request whose adapter can get no slot until a
    #: slot's adapter has none, as the emulated pods do. The replay prices it under
    #: ``SimSettings.load_admission`` "vllm" only (fewer loads there: war story -942,
    #: m-mid -410, deepseek-r1 -1,374; docs/benchmarks.md): its default admission drains
    #: instead. Off: a load costs the same on every pod, live and in the replay.
    price_slot_wait: bool = True
    #: Under soft pressure with no pod holding the adapter, wait this long for room
    #: before answering 503: under pressure, queue rather than force a load.
    pressure_wait_s: float = 0.5
    #: The largest request body read: 413 beyond it, before reading it when the
    #: Content-Length says so (a 128k-token prompt is about 0.5 MB of JSON).
    max_body_bytes: int = 1024 * 1024
    #: JSON nesting a request body may have (400 beyond): OpenAI bodies nest a few
    #: levels, tool schemas a few dozen.
    max_json_depth: int = 128
    #: Adapter names with a label of their own in the request metrics and in
    #: /v1/unplanned; names the router does not know, and any beyond this, share one.
    max_adapter_labels: int = 10_000
    #: A loop whose round failed waits its interval, doubled per failure in a row, up
    #: to this long before the next round.
    loop_backoff_max_s: float = 30.0
    #: A loop round running longer than this fails /healthz (a scrape round takes at
    #: most a scrape, a health probe and a listing: about 70 s).
    loop_stall_s: float = 300.0
    #: On SIGTERM, requests in flight get this long before the request log is closed
    #: (under Kubernetes' default 30 s grace period, so the close happens).
    shutdown_grace_s: float = 20.0

    def __post_init__(self) -> None:
        if not self.upstream_keepalive_s > 0:
            raise ValueError(
                "RouterSettings.upstream_keepalive_s must be above 0 (seconds an idle "
                f"upstream connection is reused), got {self.upstream_keepalive_s}"
            )
        if self.client_keepalive_s < 1:
            raise ValueError(
                "RouterSettings.client_keepalive_s must be at least 1 (seconds an idle "
                f"client connection is kept open), got {self.client_keepalive_s}"
            )
        if self.listing_every_scrapes < 1:
            raise ValueError(
                "RouterSettings.listing_every_scrapes must be at least 1 (1: a listing on "
                f"every scrape), got {self.listing_every_scrapes}"
            )


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    ingest_interval_s: int = 300
    forecast_interval_s: int = 900
    plan_interval_s: int = 300
    watchdog_interval_s: int = 15
    max_loads_per_event: int = 2
    webhook_max_body_bytes: int = 64 * 1024
    webhook_max_skew_s: int = 300
    webhook_rate_per_s: float = 20.0
    webhook_burst: float = 40.0
    #: Sources beyond this many share nothing: the least recently seen is forgotten.
    webhook_max_sources: int = 4096
    #: All sources together, so that many senders cannot add up to a flood.
    webhook_total_rate_per_s: float = 200.0
    #: Event ids remembered for idempotency (each for twice the timestamp window).
    webhook_max_ids: int = 50_000
    #: A failed job waits backoff_base_s, doubling per failure up to backoff_max_s.
    backoff_base_s: float = 30.0
    backoff_max_s: float = 900.0
    misfire_grace_s: int = 60
    #: Leader election as client-go does it: the lease lasts lease_duration_s; the
    #: holder stops acting once lease_renew_deadline_s passed since its last renewal,
    #: and tries to renew every lease_retry_period_s.
    lease_duration_s: int = 15
    lease_renew_deadline_s: float = 10.0
    lease_retry_period_s: float = 2.0
    #: Every Kubernetes API call gives up after this long; shorter than the renew
    #: deadline, so that a write begun while the lease is held ends before it lapses.
    api_timeout_s: float = 5.0
    #: The header a trusted proxy (an ingress) puts the sender's address in, such as
    #: X-Forwarded-For; None keys the webhook's rate limit on the client address.
    webhook_source_header: str | None = None
    #: Proxies of ours that append to that header: the sender is this many from the right.
    webhook_trusted_hops: int = 1
    #: A job run in flight longer than this counts as stuck: /healthz fails.
    job_stall_s: float = 1800.0
    #: One read of the router's request log (``controller.recent_use``) serves the
    #: preload events of this many seconds after it: a read lists and stats the log's
    #: files and folds in what was appended (some 10 ms for 100 new rows), and the log
    #: lags by the router's ``log_flush_s`` (1 s) anyway. 0: every event reads the log.
    recent_use_refresh_s: float = 2.0

    def __post_init__(self) -> None:
        refresh_s = self.recent_use_refresh_s
        if not (math.isfinite(refresh_s) and refresh_s >= 0):
            raise ValueError(
                "ControllerSettings.recent_use_refresh_s must be 0 or more finite seconds "
                "(how long one read of the router's log serves the events after it; 0: "
                f"every event reads it), got {refresh_s}"
            )


@dataclass(frozen=True, kw_only=True)
class InputSettings:
    """What a catalog's ``source`` may be: what the engines can load and nothing else."""

    #: Absolute local paths (and file:// URLs) must lie under one of these directories,
    #: as the pods see their file system.
    adapter_roots: tuple[str, ...] = ("/adapters",)
    #: URL schemes handed to the engines as they are (besides file:// under a root).
    adapter_schemes: tuple[str, ...] = ("s3", "gs")
    #: Where an adapter the catalog lacks is loaded from: a source with ``{name}`` in
    #: it (``s3://adapters/{name}``), each expansion checked as a catalog source is.
    #: None: an adapter seen in traffic but not in the catalog stays unplanned.
    adapter_source_template: str | None = None
    #: What an adapter resolved through the template is taken to be until the catalog
    #: lists it: its rank, its size (a rank-16 adapter of a 70B model's q and v
    #: projections is about 50 MB) and its class (experiment: the last to keep a slot).
    unannounced_rank: int = 16
    unannounced_size_bytes: int = 50 * MB
    unannounced_class: str = "experiment"
    #: At most this many unannounced adapters are planned (the busiest first); the
    #: rest stay unplanned, so a flood of made-up names cannot swell the solve.
    unannounced_max: int = 200


@dataclass(frozen=True, kw_only=True)
class ExecutorSettings:
    #: One pod action (a load, an unload, a warm-up) gives up after this long, retries
    #: included.
    per_action_deadline_s: float = 30.0
    #: Pod actions in flight over the whole fleet at once.
    max_concurrency: int = 32
    #: Tries per action (a listing has 3); only a retryable failure (a 5xx, 429, refused
    #: connection) is retried.
    max_attempts: int = 4
    #: A retry (of an action, or of a pod's listing) waits a full-jitter backoff from
    #: this, doubling per attempt.
    backoff_base_s: float = 0.2
    #: The backoff's cap, and of how much of a pod's Retry-After a retry (action or
    #: listing) honours.
    backoff_max_s: float = 5.0


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    """The replay simulator's pod model; loads use ``LoadCostSettings``.

    Defaults describe a Llama-3.1-70B INT4 pod on an H100: in the five swap phases a
    rank-16 adapter of about 50 MB loads in 85 ms from host RAM on an idle pod and in
    about 670 ms from storage behind a full 500 ms batch drain.
    """

    max_num_seqs: int = 32
    #: Batched prefill throughput: 20k prompt tokens/s.
    prefill_ms_per_token: float = 0.05
    #: One decode step of a small batch; it grows with batch size and adapter diversity.
    decode_ms_per_step: float = 30.0
    #: A full batch makes a step this much slower (fraction).
    batch_step_slowdown: float = 0.5
    #: Each extra distinct adapter in the batch adds this fraction to a step (batching
    #: many adapters costs under 5%, and the cost rises with their number).
    adapter_step_cost: float = 0.02
    #: KV cache per pod in tokens (30 GB at 320 KiB per token of Llama-3.1-70B).
    kv_capacity_tokens: int = 90_000
    #: A request kept waiting by memory pressure is routed again after this long.
    pressure_retry_s: float = 0.05
    #: Reactive hash routing sends adapters under this rate to the general pool.
    tail_rps: float = 0.005
    #: Time constant of the decayed per-adapter rate the reactive routers keep.
    rate_window_s: float = 600.0
    #: The lorafleet and oracle policies replan this often, over this horizon.
    plan_interval_s: float = 900.0
    plan_horizon_s: float = 1800.0
    #: An adapter absent from the plan with this many requests in ``rate_window_s``
    #: triggers an early replan (event-triggered preloads), at most once per interval.
    event_replan_requests: int = 10
    event_replan_min_gap_s: float = 60.0
    #: Adapters forecast below this rate are not planned hot: LRU serves them better
    #: than a guess (twelve requests a minute).
    plan_hot_min_rps: float = 0.2
    #: A preload may evict only an adapter idle at least this long (else it is skipped:
    #: evicting a busy adapter to guess at the future costs more than it saves).
    preload_min_idle_s: float = 120.0
    #: The oracle weighs a load's victim (by its true next use) over this horizon, its
    #: own, not lorafleet's ``RouterSettings.victim_horizon_s``: a bound tuned for
    #: itself. 600 s over 60 s: fewer loads and no higher TTFT p95 on legal-research, the
    #: war story, m-mid and deepseek-r1 (docs/benchmarks.md, "Prediction pays").
    oracle_victim_horizon_s: float = 600.0
    #: Windows for peak load rate and the convoy flag.
    metrics_window_s: float = 300.0
    #: Above 0.5 swaps per second per pod a cascade is under way.
    convoy_loads_per_pod_s: float = 0.5
    #: How a pod admits requests around a load. "drain": the load drains the running
    #: batch first (up to ``LoadCostSettings.max_drain_ms``) and the pod admits nothing
    #: until it lands (the convoy effect of the domain brief). "vllm": vLLM's scheduler
    #: (``Scheduler.schedule``'s max_loras check): no drain; a request whose adapter
    #: cannot get a GPU slot (every slot's adapter has a request running) waits while
    #: those behind it on resident adapters run, and the load stalls the running batch
    #: for its duration (the model runner activates adapters inside the step).
    load_admission: LoadAdmission = "drain"

    def __post_init__(self) -> None:
        if self.load_admission not in LOAD_ADMISSIONS:
            raise ValueError(
                f"SimSettings.load_admission must be {' or '.join(map(repr, LOAD_ADMISSIONS))},"
                f" got {self.load_admission!r}"
            )
        horizon_s = self.oracle_victim_horizon_s
        if not (math.isfinite(horizon_s) and horizon_s > 0):
            raise ValueError(
                "SimSettings.oracle_victim_horizon_s must be finite seconds above 0 (the "
                "oracle weighs a load's victim by its chance of a request within it), "
                f"got {horizon_s}"
            )


@dataclass(frozen=True, kw_only=True)
class Settings:
    load_cost: LoadCostSettings = field(default_factory=LoadCostSettings)
    forecast: ForecastSettings = field(default_factory=ForecastSettings)
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    inputs: InputSettings = field(default_factory=InputSettings)
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    sim: SimSettings = field(default_factory=SimSettings)
