"""The Kubernetes side of the cluster ports, over the official ``kubernetes`` client.

Owns: discovering serving pods by label selector, the plan ConfigMap (current and
previous, for ``lorafleet rollback``, in one object so that a publish and a rollback
are each one conditional write), the controller's state ConfigMap, the hot-sets
ConfigMap (each pod's hot set, for people: the controller patches no pod), a key of
a ConfigMap people write (the catalog, read with its resourceVersion:
``KubeConfigMapKey``), and the coordination.k8s.io/v1 Lease used for leader election.
It must not decide anything: what to publish, when to act and who leads are the
caller's (``placement.controller.ticks``, ``placement.controller.leader``).

Every client exception leaves this module as a ``KubeError`` subclass: 409 becomes
``KubeConflictError``; 429, 5xx and transport failures ``RetryableKubeError``.

Every ConfigMap write replaces the object at the resourceVersion it was read at: a
write racing another (a rollback, a new leader) fails with ``KubeConflictError``
instead of overwriting it. Given a ``term`` (the leader's fencing token, see
``placement.controller.leader``), a write also stamps it on the object
(``lorafleet.io/leader-term``) and refuses, with ``LeadershipLostError``, an object a
later term wrote: a deposed leader that wakes up from a pause cannot overwrite its
successor. Each call gives up after ``KubeTarget.request_timeout_s``
(the controller passes ``ControllerSettings.api_timeout_s``, shorter than the lease's
renew deadline).

The controller's Role in ``deploy/base/rbac.yaml`` grants exactly what it uses here
(``tests/deploy`` checks it against a fake API server): pods list, configmaps
get/create/update, leases get/create/update; no pod patch. ``watch_pods`` needs
pods/watch too; no deployed process calls it yet.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from placement.domain import AdapterId, PodId, PoolId
from placement.errors import (
    KubeConflictError,
    KubeError,
    LeadershipLostError,
    PlanError,
    RetryableKubeError,
)
from placement.plan import Plan, plan_from_json, plan_to_json
from placement.ports import (
    PLAN_ID_ANNOTATION,
    POOL_LABEL,
    DiscoveredPod,
    LeaseRecord,
    PodEvent,
    PodEventKind,
    StoredState,
    hot_set_entries,
)

logger = logging.getLogger(__name__)

#: A ConfigMap holds at most 1 MiB; leave room for its metadata.
CONFIGMAP_DATA_LIMIT_BYTES = 1_000_000
PLAN_KEY = "plan.json"
PREVIOUS_PLAN_KEY = "previous.json"
STATE_PLAN_KEY = "last-plan.json"
STATE_LEDGER_KEY = "ledger.json"


@dataclass(frozen=True, kw_only=True)
class KubeTarget:
    """Where lorafleet's objects live and how serving pods are found."""

    namespace: str
    selector: str = "app.kubernetes.io/component=lora-server"
    pool_label: str = POOL_LABEL
    #: A pod's pool when it lacks ``pool_label``; None leaves such pods out.
    default_pool: str | None = None
    port_name: str = "http"
    default_port: int = 8000
    plan_configmap: str = "lorafleet-plan"
    state_configmap: str = "lorafleet-state"
    hot_sets_configmap: str = "lorafleet-hot-sets"
    lease_name: str = "lorafleet-controller"
    request_timeout_s: float = 5.0


def connect(*, host: str | None = None) -> client.ApiClient:
    """An API client: to ``host`` when given (tests, proxies), else in-cluster or kubeconfig."""
    if host is not None:
        configuration = client.Configuration(host=host, retries=False)
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise KubeError(f"no Kubernetes configuration found: {exc}") from None
    return client.ApiClient()


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(exc.reason or "no reason given")


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn the client's exceptions into lorafleet's KubeError tree."""
    try:
        yield
    except ApiException as exc:
        status = int(exc.status or 0)
        message = f"{what}: HTTP {status}: {_api_message(exc)}"
        if status == 409:
            raise KubeConflictError(message, status=status) from None
        if status in {0, 429} or status >= 500:
            raise RetryableKubeError(message, status=status) from None
        raise KubeError(message, status=status) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise RetryableKubeError(f"{what}: {type(exc).__name__}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # the client could not parse the answer
        raise KubeError(f"{what}: malformed answer: {type(exc).__name__}: {exc}") from None


def _not_found(exc: KubeError) -> bool:
    return exc.status == 404


# --- pods -----------------------------------------------------------------------


def _is_ready(pod: client.V1Pod) -> bool:
    status = pod.status
    if pod.metadata is None or pod.metadata.deletion_timestamp is not None or status is None:
        return False
    if status.phase != "Running" or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())


def _port_of(pod: client.V1Pod, target: KubeTarget) -> int:
    for container in pod.spec.containers if pod.spec is not None else ():
        for port in container.ports or ():
            if port.name == target.port_name:
                return int(port.container_port)
    return target.default_port


def to_discovered(pod: client.V1Pod, target: KubeTarget) -> DiscoveredPod | None:
    """The pod as the ports see it, or None when it names no pool."""
    meta = pod.metadata
    if meta is None or not meta.name:
        return None
    labels = dict(meta.labels or {})
    pool = labels.get(target.pool_label, target.default_pool)
    if pool is None:
        logger.warning("pod %s has no %s label; left out", meta.name, target.pool_label)
        return None
    return DiscoveredPod(
        name=PodId(meta.name),
        pool=PoolId(pool),
        ip=(pod.status.pod_ip if pod.status is not None else None) or "",
        port=_port_of(pod, target),
        ready=_is_ready(pod),
        labels=labels,
    )


class KubePods:
    """Serving pods selected by label, ready ones only in ``list_pods``."""

    def __init__(self, api: client.ApiClient, *, target: KubeTarget) -> None:
        self._core = client.CoreV1Api(api)
        self._target = target

    def list_pods(self) -> tuple[DiscoveredPod, ...]:
        with _translated(f"list pods {self._target.selector!r}"):
            listed = self._core.list_namespaced_pod(
                self._target.namespace,
                label_selector=self._target.selector,
                _request_timeout=self._target.request_timeout_s,
            )
        pods = (to_discovered(pod, self._target) for pod in listed.items or ())
        return tuple(sorted((p for p in pods if p is not None and p.ready), key=lambda p: p.name))

    def watch_pods(self, *, timeout_s: int) -> Iterator[PodEvent]:
        watcher = watch.Watch()  # type: ignore[no-untyped-call]
        stream = watcher.stream(  # type: ignore[no-untyped-call]
            self._core.list_namespaced_pod,
            self._target.namespace,
            label_selector=self._target.selector,
            timeout_seconds=timeout_s,
        )
        while True:
            with _translated(f"watch pods {self._target.selector!r}"):
                event = next(stream, None)
            if event is None:
                return
            kind = str(event.get("type", ""))
            if kind not in PodEventKind.__members__:
                continue
            found = to_discovered(event["object"], self._target)
            if found is not None:
                yield PodEvent(kind=PodEventKind(kind), pod=found)


class KubeHotSets:
    """Each pod's hot set in one ConfigMap: ``kubectl get configmap lorafleet-hot-sets
    -o yaml`` shows, per pod, ``<count> <digest> <adapters>``, and the plan id in the
    ``lorafleet.io/plan-id`` annotation. One write per plan, no pod patched."""

    def __init__(
        self, api: client.ApiClient, *, target: KubeTarget, term: Term | None = None
    ) -> None:
        self._maps = _ConfigMaps(api, target=target, name=target.hot_sets_configmap, term=term)

    def publish_hot_sets(
        self, hot_sets: Mapping[PodId, tuple[AdapterId, ...]], *, plan_id: str
    ) -> None:
        self._maps.write(
            self._maps.read(), hot_set_entries(hot_sets), annotations={PLAN_ID_ANNOTATION: plan_id}
        )


# --- config maps ----------------------------------------------------------------


#: The fencing token of the leader that last wrote a ConfigMap.
TERM_ANNOTATION = "lorafleet.io/leader-term"
#: The leader's fencing token now; None when it does not lead.
Term = Callable[[], float | None]


class _ConfigMaps:
    """Read-modify-write of one ConfigMap's data, guarded by its resourceVersion and,
    given a ``term``, by the writer's fencing token."""

    def __init__(
        self, api: client.ApiClient, *, target: KubeTarget, name: str, term: Term | None = None
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._target = target
        self.name = name
        self._term = term

    def _stamp(self, existing: client.V1ConfigMap | None) -> dict[str, str]:
        """Our term's annotation; LeadershipLostError when a later term wrote last."""
        if self._term is None:
            return {}
        ours = self._term()
        if ours is None:
            raise LeadershipLostError(f"configmap {self.name}: this replica does not lead")
        meta = existing.metadata if existing is not None else None
        written = ((meta.annotations if meta is not None else None) or {}).get(TERM_ANNOTATION)
        try:
            theirs = float(written) if written is not None else None
        except ValueError:
            theirs = None
        if theirs is not None and theirs > ours:
            raise LeadershipLostError(
                f"configmap {self.name} was written by a later leader (term {theirs:.6f} > "
                f"ours {ours:.6f}): not overwriting it"
            )
        return {TERM_ANNOTATION: f"{ours:.6f}"}

    def read(self) -> client.V1ConfigMap | None:
        try:
            with _translated(f"read configmap {self.name}"):
                return self._core.read_namespaced_config_map(
                    self.name, self._target.namespace, _request_timeout=self._timeout
                )
        except KubeError as exc:
            if _not_found(exc):
                return None
            raise

    def write(
        self,
        existing: client.V1ConfigMap | None,
        data: dict[str, str],
        *,
        annotations: dict[str, str] | None = None,
    ) -> None:
        annotations = {**(annotations or {}), **self._stamp(existing)}
        size = sum(len(key) + len(value.encode()) for key, value in data.items())
        if size > CONFIGMAP_DATA_LIMIT_BYTES:
            raise KubeError(
                f"configmap {self.name}: {size} bytes of data exceed the "
                f"{CONFIGMAP_DATA_LIMIT_BYTES} a ConfigMap can hold"
            )
        ns = self._target.namespace
        if existing is None:
            body = client.V1ConfigMap(
                metadata=client.V1ObjectMeta(
                    name=self.name, namespace=ns, labels=_OWNED, annotations=annotations
                ),
                data=data,
            )
            with _translated(f"create configmap {self.name}"):
                self._core.create_namespaced_config_map(ns, body, _request_timeout=self._timeout)
            return
        existing.data = data
        if annotations and existing.metadata is not None:
            existing.metadata.annotations = {**(existing.metadata.annotations or {}), **annotations}
        with _translated(f"replace configmap {self.name}"):
            self._core.replace_namespaced_config_map(
                self.name, ns, existing, _request_timeout=self._timeout
            )

    @property
    def _timeout(self) -> float:
        return self._target.request_timeout_s


_OWNED = {"app.kubernetes.io/managed-by": "lorafleet"}


def _data(configmap: client.V1ConfigMap | None) -> dict[str, str]:
    return dict(configmap.data or {}) if configmap is not None else {}


class KubeConfigMapKey:
    """One key of a ConfigMap people write (``catalog.yaml`` of the inputs), read with
    the object's resourceVersion, so a reader can tell a change without comparing text."""

    def __init__(self, api: client.ApiClient, *, target: KubeTarget, name: str, key: str) -> None:
        self._maps = _ConfigMaps(api, target=target, name=name)
        self.key = key
        self.description = f"configmap {target.namespace}/{name} key {key}"

    def read(self) -> tuple[str, str]:
        """The object's resourceVersion and the key's text; KubeError when the
        ConfigMap or the key is missing."""
        configmap = self._maps.read()
        if configmap is None:
            raise KubeError(f"{self.description}: no such configmap")
        text = _data(configmap).get(self.key)
        if text is None:
            raise KubeError(f"{self.description}: the configmap has no such key")
        meta = configmap.metadata
        return str(meta.resource_version if meta is not None else ""), text


class KubePlanStore:
    """The plan ConfigMap: ``plan.json`` is current, ``previous.json`` the one before."""

    def __init__(
        self, api: client.ApiClient, *, target: KubeTarget, term: Term | None = None
    ) -> None:
        self._maps = _ConfigMaps(api, target=target, name=target.plan_configmap, term=term)

    def publish(self, plan: Plan) -> None:
        existing = self._maps.read()
        data = _data(existing)
        new = {PLAN_KEY: plan_to_json(plan)}
        if PLAN_KEY in data:
            new[PREVIOUS_PLAN_KEY] = data[PLAN_KEY]
        self._maps.write(existing, new)

    def current(self) -> Plan | None:
        return self._plan(PLAN_KEY)

    def previous(self) -> Plan | None:
        return self._plan(PREVIOUS_PLAN_KEY)

    def rollback(self) -> Plan:
        existing = self._maps.read()
        data = _data(existing)
        if PREVIOUS_PLAN_KEY not in data or PLAN_KEY not in data:
            raise PlanError(f"configmap {self._maps.name} has no previous plan to roll back to")
        restored = plan_from_json(data[PREVIOUS_PLAN_KEY], source=self._source(PREVIOUS_PLAN_KEY))
        self._maps.write(
            existing, {PLAN_KEY: data[PREVIOUS_PLAN_KEY], PREVIOUS_PLAN_KEY: data[PLAN_KEY]}
        )
        return restored

    def _plan(self, key: str) -> Plan | None:
        text = _data(self._maps.read()).get(key)
        return None if text is None else plan_from_json(text, source=self._source(key))

    def _source(self, key: str) -> str:
        return f"configmap {self._maps.name}/{key}"


class KubeStateStore:
    """The controller's state ConfigMap: the last good plan and the ledger of loads."""

    def __init__(
        self, api: client.ApiClient, *, target: KubeTarget, term: Term | None = None
    ) -> None:
        self._maps = _ConfigMaps(api, target=target, name=target.state_configmap, term=term)

    def load(self) -> StoredState:
        data = _data(self._maps.read())
        return StoredState(
            plan_json=data.get(STATE_PLAN_KEY), ledger_json=data.get(STATE_LEDGER_KEY)
        )

    def save(self, state: StoredState) -> None:
        data = {}
        if state.plan_json is not None:
            data[STATE_PLAN_KEY] = state.plan_json
        if state.ledger_json is not None:
            data[STATE_LEDGER_KEY] = state.ledger_json
        self._maps.write(self._maps.read(), data)


# --- lease ----------------------------------------------------------------------


def _to_record(lease: client.V1Lease) -> LeaseRecord:
    spec = lease.spec or client.V1LeaseSpec()
    return LeaseRecord(
        holder=spec.holder_identity or None,
        duration_s=int(spec.lease_duration_seconds or 0),
        acquired_at=spec.acquire_time,
        renewed_at=spec.renew_time,
        transitions=int(spec.lease_transitions or 0),
        version=lease.metadata.resource_version if lease.metadata is not None else None,
    )


class KubeLeaseStore:
    """The coordination.k8s.io/v1 Lease the controller replicas elect a leader with."""

    def __init__(self, api: client.ApiClient, *, target: KubeTarget) -> None:
        self._coordination = client.CoordinationV1Api(api)
        self._target = target

    def read(self) -> LeaseRecord | None:
        target = self._target
        try:
            with _translated(f"read lease {target.lease_name}"):
                lease = self._coordination.read_namespaced_lease(
                    target.lease_name, target.namespace, _request_timeout=target.request_timeout_s
                )
        except KubeError as exc:
            if _not_found(exc):
                return None
            raise
        return _to_record(lease)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        target = self._target
        with _translated(f"create lease {target.lease_name}"):
            lease = self._coordination.create_namespaced_lease(
                target.namespace, self._body(record), _request_timeout=target.request_timeout_s
            )
        return _to_record(lease)

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        target = self._target
        with _translated(f"replace lease {target.lease_name}"):
            lease = self._coordination.replace_namespaced_lease(
                target.lease_name,
                target.namespace,
                self._body(record),
                _request_timeout=target.request_timeout_s,
            )
        return _to_record(lease)

    def _body(self, record: LeaseRecord) -> client.V1Lease:
        return client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=self._target.lease_name,
                namespace=self._target.namespace,
                resource_version=record.version,
                labels=_OWNED,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=record.holder or "",
                lease_duration_seconds=record.duration_s,
                acquire_time=record.acquired_at,
                renew_time=record.renewed_at,
                lease_transitions=record.transitions,
            ),
        )
