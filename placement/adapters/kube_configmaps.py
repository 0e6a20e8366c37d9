"""The ConfigMaps of the cluster ports: the plan (current and previous, for ``lorafleet
rollback``, in one object so that a publish and a rollback are each one conditional
write), the controller's state, the hot sets (each pod's hot set, for people: the
controller patches no pod), and a key of a ConfigMap people write (the catalog, read
with its resourceVersion: ``KubeConfigMapKey``).

Every ConfigMap write replaces the object at the resourceVersion it was read at: a
write racing another (a rollback, a new leader) fails with ``KubeConflictError``
instead of overwriting it. Given a ``term`` (the leader's fencing token, see
``placement.controller.leader``), a write also stamps it on the object
(``lorafleet.io/leader-term``) and refuses, with ``LeadershipLostError``, an object a
later term wrote: a deposed leader that wakes up from a pause cannot overwrite its
successor; an annotation that holds no term (``abc``, ``nan``) is a ``KubeError`` naming
it, and the object is not written: it may be a later leader's. A write whose data would
not fit a ConfigMap is refused before it is sent. ``claim`` rewrites an object as it
is under a new leader's term, which a leader does on taking the lease: a deposed
leader's write already past its checks (read before its pause, sent after it) then
fails on the resourceVersion instead of landing before the successor's first write.

Must not decide what to publish or when: that is the caller's
(``placement.controller.ticks``). Import these from ``placement.adapters.kube``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from kubernetes import client

from placement.adapters.kube_api import OWNED_LABELS, KubeTarget, not_found, translated
from placement.domain import AdapterId, PodId
from placement.errors import KubeError, LeadershipLostError, PlanError
from placement.plan import Plan, plan_from_json, plan_input_error, plan_to_json
from placement.ports import PLAN_ID_ANNOTATION, StoredState, hot_set_entries

#: A ConfigMap holds at most 1 MiB; leave room for its metadata.
CONFIGMAP_DATA_LIMIT_BYTES = 1_000_000
PLAN_KEY = "plan.json"
PREVIOUS_PLAN_KEY = "previous.json"
STATE_PLAN_KEY = "last-plan.json"
STATE_LEDGER_KEY = "ledger.json"

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
        theirs = None if written is None else self._term_of(written)
        if theirs is not None and theirs > ours:
            raise LeadershipLostError(
                f"configmap {self.name} was written by a later leader (term {theirs:.6f} > "
                f"ours {ours:.6f}): not overwriting it"
            )
        return {TERM_ANNOTATION: f"{ours:.6f}"}

    def _term_of(self, written: str) -> float:
        """The term an annotation holds; a KubeError naming it when it holds none: a
        term we cannot read may be a later leader's, so nothing overwrites it."""
        try:
            term = float(written)
        except ValueError:
            term = math.nan
        if not math.isfinite(term):
            raise KubeError(
                f"configmap {self.name}: annotation {TERM_ANNOTATION}: {written!r} is not a "
                "leader term (accepted: the Unix seconds a leader took the lease at, as it "
                "writes them, e.g. '1764763200.250000'); not overwriting it: correct the "
                "annotation or remove it"
            )
        return term

    def claim(self) -> None:
        """Rewrite the object as it is, stamped with our term: a write read before it
        (a deposed leader's, sent after a pause) now fails on the resourceVersion. An
        object not yet created is left alone: a deposed leader's late create of it is
        overwritten by our first write of it."""
        existing = self.read()
        if existing is not None:
            self.write(existing, dict(existing.data or {}))

    def read(self) -> client.V1ConfigMap | None:
        try:
            with translated(f"read configmap {self.name}"):
                return self._core.read_namespaced_config_map(
                    self.name, self._target.namespace, _request_timeout=self._timeout
                )
        except KubeError as exc:
            if not_found(exc):
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
                    name=self.name, namespace=ns, labels=OWNED_LABELS, annotations=annotations
                ),
                data=data,
            )
            with translated(f"create configmap {self.name}"):
                self._core.create_namespaced_config_map(ns, body, _request_timeout=self._timeout)
            return
        existing.data = data
        if annotations and existing.metadata is not None:
            existing.metadata.annotations = {**(existing.metadata.annotations or {}), **annotations}
        with translated(f"replace configmap {self.name}"):
            self._core.replace_namespaced_config_map(
                self.name, ns, existing, _request_timeout=self._timeout
            )

    @property
    def _timeout(self) -> float:
        return self._target.request_timeout_s


def _data(configmap: client.V1ConfigMap | None) -> dict[str, str]:
    return dict(configmap.data or {}) if configmap is not None else {}


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

    def claim(self) -> None:
        self._maps.claim()


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
        version = configmap.metadata.resource_version if configmap.metadata is not None else None
        if not version:  # a reader tells a change by it: without one it would see none
            raise KubeError(f"{self.description}: the configmap has no metadata.resourceVersion")
        return str(version), text


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

    def claim(self) -> None:
        self._maps.claim()

    def current(self) -> Plan | None:
        return self._plan(PLAN_KEY)

    def previous(self) -> Plan | None:
        return self._plan(PREVIOUS_PLAN_KEY)

    def rollback(self) -> Plan:
        existing = self._maps.read()
        data = _data(existing)
        if PREVIOUS_PLAN_KEY not in data or PLAN_KEY not in data:
            raise PlanError(f"configmap {self._maps.name} has no previous plan to roll back to")
        source = self._source(PREVIOUS_PLAN_KEY)
        try:
            restored = plan_from_json(data[PREVIOUS_PLAN_KEY], source=source)
        except PlanError as exc:  # a bad object, as a bad file is: exit 2, nothing swapped
            raise plan_input_error(exc, source) from None
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

    def claim(self) -> None:
        self._maps.claim()


def claim_all(*stores: KubePlanStore | KubeStateStore | KubeHotSets) -> None:
    """``claim`` each store's ConfigMap, in turn: what a leader does on taking the lease."""
    for store in stores:
        store.claim()
