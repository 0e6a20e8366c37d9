"""The Kubernetes side of the cluster ports, over the official ``kubernetes`` client.

Owns: discovering serving pods by label selector, and the coordination.k8s.io/v1
Lease used for leader election. The ConfigMaps (the plan, the controller's state, the
hot sets, a key of a ConfigMap people write) are ``adapters.kube_configmaps``'s; the
client, the target and the translation of the client's errors (every one leaves as a
``KubeError``) are ``adapters.kube_api``'s. Callers import every cluster port, and
``KubeTarget`` and ``connect``, from here. It must not decide anything: what to
publish, when to act and who leads are the caller's (``placement.controller.ticks``,
``placement.controller.leader``).

The controller's Role in ``deploy/base/rbac.yaml`` grants exactly what it uses here
and in ``kube_configmaps`` (``tests/deploy`` checks it against a fake API server): pods
list, configmaps get/create/update, leases get/create/update; no pod patch.
``watch_pods`` needs pods/watch too; no deployed process calls it yet.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from kubernetes import client, watch

from placement.adapters.kube_api import OWNED_LABELS, KubeTarget, connect, not_found, translated
from placement.adapters.kube_configmaps import (
    KubeConfigMapKey,
    KubeHotSets,
    KubePlanStore,
    KubeStateStore,
    claim_all,
)
from placement.domain import PodId, PoolId
from placement.errors import KubeError
from placement.ports import DiscoveredPod, LeaseRecord, PodEvent, PodEventKind

__all__ = [
    "KubeConfigMapKey",
    "KubeHotSets",
    "KubeLeaseStore",
    "KubePlanStore",
    "KubePods",
    "KubeStateStore",
    "KubeTarget",
    "LeftOut",
    "claim_all",
    "connect",
    "to_discovered",
]

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True, kw_only=True)
class LeftOut:
    """A listed pod ``to_discovered`` leaves out: ``key`` names it (its name, or its IP
    without one) and ``why`` is the warning that says so."""

    key: str
    why: str


def to_discovered(pod: client.V1Pod, target: KubeTarget) -> DiscoveredPod | LeftOut:
    """The pod as the ports see it, or why it is left out: no metadata.name, or it names
    no pool: no pool label (and no ``default_pool``), or an empty one, which is not read
    as the default pool. Says nothing: ``KubePods`` warns, once per pod and reason."""
    meta = pod.metadata
    ip = (pod.status.pod_ip if pod.status is not None else None) or ""
    if meta is None or not meta.name:
        why = f"a pod the API listed has no metadata.name (pod IP {ip or None}); left out"
        return LeftOut(key=f"(no name, IP {ip})", why=why)
    labels = dict(meta.labels or {})
    named = labels.get(target.pool_label)
    if named == "":  # set, to nothing: not taken for the default pool
        why = f"pod {meta.name}: label {target.pool_label} is empty: it names no pool; left out"
        return LeftOut(key=meta.name, why=why)
    pool = named if named is not None else target.default_pool
    if not pool:
        return LeftOut(
            key=meta.name, why=f"pod {meta.name} has no {target.pool_label} label; left out"
        )
    return DiscoveredPod(
        name=PodId(meta.name),
        pool=PoolId(pool),
        ip=ip,
        port=_port_of(pod, target),
        ready=_is_ready(pod),
        labels=labels,
    )


class KubePods:
    """Serving pods selected by label, ready ones only in ``list_pods``.

    A pod left out is warned of once while it stays left out for the same reason; each
    poll or event that finds it so again says it at DEBUG. A new reason, or the pod
    coming right and breaking again, warns again. Only pods of the last listing are
    remembered (a watch forgets one deleted or come right), so the table stays as small
    as the selection."""

    def __init__(self, api: client.ApiClient, *, target: KubeTarget) -> None:
        self._core = client.CoreV1Api(api)
        self._target = target
        #: Each pod left out, by ``LeftOut.key``, with the warning said of it.
        self._told: dict[str, str] = {}

    def _tell(self, left_out: LeftOut) -> None:
        if self._told.get(left_out.key) == left_out.why:
            logger.debug("%s", left_out.why)
            return
        self._told[left_out.key] = left_out.why
        logger.warning("%s", left_out.why)

    def _kept(self, found: DiscoveredPod | LeftOut) -> DiscoveredPod | None:
        if isinstance(found, LeftOut):
            self._tell(found)
            return None
        self._told.pop(found.name, None)
        return found

    def list_pods(self) -> tuple[DiscoveredPod, ...]:
        with translated(f"list pods {self._target.selector!r}"):
            listed = self._core.list_namespaced_pod(
                self._target.namespace,
                label_selector=self._target.selector,
                _request_timeout=self._target.request_timeout_s,
            )
        found = [to_discovered(pod, self._target) for pod in listed.items or ()]
        left_out = {f.key for f in found if isinstance(f, LeftOut)}
        self._told = {key: why for key, why in self._told.items() if key in left_out}
        pods = (self._kept(f) for f in found)
        return tuple(sorted((p for p in pods if p is not None and p.ready), key=lambda p: p.name))

    def watch_pods(self, *, timeout_s: int) -> Iterator[PodEvent]:
        watcher = watch.Watch()  # type: ignore[no-untyped-call]
        stream = watcher.stream(  # type: ignore[no-untyped-call]
            self._core.list_namespaced_pod,
            self._target.namespace,
            label_selector=self._target.selector,
            timeout_seconds=timeout_s,
        )
        what = f"watch pods {self._target.selector!r}"
        end = object()
        while True:
            with translated(what):
                try:
                    event = next(stream, end)
                except (KeyError, TypeError) as exc:  # the client reads events unchecked
                    raise KubeError(
                        f"{what}: malformed event: {type(exc).__name__}: {exc}"
                    ) from None
            if event is end:
                return
            if not isinstance(event, dict):  # a line that is not JSON: the client yields None
                logger.warning("%s: an event that is not JSON was left out", what)
                continue
            kind = str(event.get("type", ""))
            if kind not in PodEventKind.__members__:
                continue
            found = to_discovered(event["object"], self._target)
            if isinstance(found, LeftOut) and kind == PodEventKind.DELETED.value:
                self._told.pop(found.key, None)  # gone: nothing left to say of it
                continue
            pod = self._kept(found)
            if pod is not None:
                yield PodEvent(kind=PodEventKind(kind), pod=pod)


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
            with translated(f"read lease {target.lease_name}"):
                lease = self._coordination.read_namespaced_lease(
                    target.lease_name, target.namespace, _request_timeout=target.request_timeout_s
                )
        except KubeError as exc:
            if not_found(exc):
                return None
            raise
        return _to_record(lease)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        target = self._target
        with translated(f"create lease {target.lease_name}"):
            lease = self._coordination.create_namespaced_lease(
                target.namespace, self._body(record), _request_timeout=target.request_timeout_s
            )
        return _to_record(lease)

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        target = self._target
        with translated(f"replace lease {target.lease_name}"):
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
                labels=OWNED_LABELS,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=record.holder or "",
                lease_duration_seconds=record.duration_s,
                acquire_time=record.acquired_at,
                renew_time=record.renewed_at,
                lease_transitions=record.transitions,
            ),
        )
