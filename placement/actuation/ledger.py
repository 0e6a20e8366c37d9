"""The controller's ledger: each pod's engine model, fed every action lorafleet ran.

Neither engine reports which adapters sit on its GPU, so the ledger keeps one
``placement.residency.PodResidency`` per pod under its pool's engine and applies to it
every action the executor ran, in the order they ran: a load is the engine's load (in
place too; SGLang's client unloads and loads again), an unload its unload, a warm-up a
request. "Hot" here means on the GPU as the engine has it: on vLLM a load pushes the
least recently used adapter off, and an unloaded name keeps its slot until LRU eviction.

Each observation's ``/v1/models`` listing corrects the model: a name it lists no more
was unloaded (or, when none of the ledger's names is left, the pod restarted); a listed
name the ledger lacks was loaded by someone else, and is applied as a load at the cold
end (older than everything the ledger knows, so it is the first to go).

The ledger also remembers which adapters lorafleet loaded pinned: reconcile never
unloads them. ``to_dict`` saves each pod's limits, its listed names, its host-cache and
GPU orders (unloaded names' entries included) and pins; ``from_dict`` builds each model
again by calls on a fresh one, so the restored model lists, caches and activates as the
saved one did, and goes on as it would have.

Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from placement.domain import Action, ActionKind, AdapterId, Pod, PodId
from placement.residency import (
    EngineModel,
    PinLimitError,
    PodResidency,
    ResidencyError,
    engine_model,
)

__all__ = ["LEDGER_FORMAT", "Ledger", "SavedPod"]

#: The saved form's version (1: the activations list before the engine model).
LEDGER_FORMAT = 2


@dataclass(frozen=True, kw_only=True)
class SavedPod:
    """What rebuilds one pod's engine model: its limits and its entries, in order."""

    engine: EngineModel
    max_loras: int
    max_cpu_loras: int
    #: Listed names and their paths, by name (the order a pod lists them in is no state).
    listed: tuple[tuple[str, str], ...] = ()
    #: Host-cache entries, oldest first: a name, and whether it is listed (False: an
    #: unloaded name's entry on vLLM).
    host: tuple[tuple[str, bool], ...] = ()
    #: GPU slots' entries, least recently used first, likewise.
    gpu: tuple[tuple[str, bool], ...] = ()
    #: SGLang's pinned adapters (the engine's pins).
    engine_pinned: tuple[str, ...] = ()
    #: SGLang: names its soft cap unloaded, loaded again on their next request.
    parked: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, model: PodResidency) -> SavedPod:
        return cls(
            engine=model.engine,
            max_loras=model.max_loras,
            max_cpu_loras=model.max_cpu_loras or model.max_loras,
            listed=tuple(sorted(model.listed.items())),
            host=model.host_entries(),
            gpu=model.gpu_entries(),
            engine_pinned=tuple(sorted(model.pinned)),
            parked=tuple(sorted(model.parked.items())),
        )

    def build(self) -> PodResidency:
        """A fresh model brought to this state by the engine's own calls: entries in
        host order (an unloaded name's entry: loaded, then unloaded), each loaded with
        its pin; on SGLang those on the GPU are requested where they stand. On vLLM,
        listed names whose weights left the host cache are loaded first, so that the
        full cache drops them again; the GPU then holds the last entries, as it did."""
        model = PodResidency(
            self.engine, max_loras=self.max_loras, max_cpu_loras=self.max_cpu_loras
        )
        paths = dict(self.listed)
        in_host = {name for name, listed in self.host if listed}
        on_gpu = {name for name, listed in self.gpu if listed}
        pins = set(self.engine_pinned)
        for name in (n for n in paths if n not in in_host):
            _load(model, name, paths[name])
        for ghost, (name, listed) in enumerate(self.host):
            if not listed:
                stand_in = f"?unloaded-{ghost}" if name in model.listed else name
                if _load(model, stand_in, ""):
                    model.unload(stand_in)
                continue
            _load(model, name, paths.get(name, ""), pinned=name in pins)
            if model.engine.is_sglang and name in on_gpu and model.serves(name):
                model.request(name)
        model.parked.update((n, p) for n, p in self.parked if n not in model.listed)
        return model

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine.value,
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras,
            "listed": [list(pair) for pair in self.listed],
            "host": [list(entry) for entry in self.host],
            "gpu": [list(entry) for entry in self.gpu],
            "engine_pinned": list(self.engine_pinned),
            "parked": [list(pair) for pair in self.parked],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SavedPod:
        """Raises ``TypeError`` or ``ValueError`` on anything not written by ``to_dict``."""
        return cls(
            engine=EngineModel(_str(raw["engine"])),
            max_loras=_int(raw["max_loras"]),
            max_cpu_loras=_int(raw["max_cpu_loras"]),
            listed=tuple((_str(n), _str(p)) for n, p in _pairs(raw.get("listed", []))),
            host=tuple((_str(n), _bool(f)) for n, f in _pairs(raw.get("host", []))),
            gpu=tuple((_str(n), _bool(f)) for n, f in _pairs(raw.get("gpu", []))),
            engine_pinned=tuple(_str(n) for n in _list(raw.get("engine_pinned", []))),
            parked=tuple((_str(n), _str(p)) for n, p in _pairs(raw.get("parked", []))),
        )


class Ledger:
    """Each pod's engine model and lorafleet's pins; the caller keeps it between applies.

    A pod is tracked (its model made, empty) when it is first observed, or named by
    ``track_pods``; actions on a pod not tracked are not recorded (its next listing
    fills the model in, at the cold end)."""

    def __init__(self) -> None:
        self.pods: dict[PodId, PodResidency] = {}
        #: Adapters lorafleet loaded pinned, per pod: never unloaded by reconcile.
        self.pinned: dict[PodId, set[AdapterId]] = {}

    # tracking and correcting -------------------------------------------------------
    def track(
        self, pod_id: PodId, *, engine: EngineModel, max_loras: int, max_cpu_loras: int
    ) -> PodResidency:
        """``pod_id``'s model, made empty the first time. New limits rebuild it with
        what it holds; another engine starts it empty (the pod restarted)."""
        max_loras = max(1, max_loras)
        max_cpu_loras = max(max_loras, max_cpu_loras)
        model = self.pods.get(pod_id)
        limits = (engine, max_loras, max_cpu_loras)
        if model is not None and (model.engine, model.max_loras, model.max_cpu_loras) == limits:
            return model
        saved = SavedPod(engine=engine, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
        if model is not None and model.engine is engine:
            saved = replace(SavedPod.of(model), max_loras=max_loras, max_cpu_loras=max_cpu_loras)
        self.pods[pod_id] = model = saved.build()
        return model

    def track_pods(self, pods: Iterable[Pod]) -> None:
        for pod in pods:
            self.track(
                pod.name,
                engine=engine_model(pod.engine),
                max_loras=pod.max_loras,
                max_cpu_loras=pod.max_cpu_loras,
            )

    def observe(
        self,
        pod_id: PodId,
        *,
        listed: Mapping[AdapterId, str],
        engine: EngineModel,
        max_loras: int,
        max_cpu_loras: int,
    ) -> None:
        """Correct ``pod_id``'s model from what the pod lists now (names and paths)."""
        model = self.track(pod_id, engine=engine, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
        known = [AdapterId(name) for name in model.listed]
        if known and not any(name in listed for name in known):
            model.restart()  # none of its names is left: it restarted
        else:
            for name in known:
                if name not in listed:
                    model.unload(name)  # someone unloaded it (vLLM: its slot stays)
        self.pinned[pod_id] = {a for a in self.pinned.get(pod_id, ()) if a in listed}
        unknown = {name: listed[name] for name in sorted(listed) if name not in model.listed}
        if unknown:
            self.pods[pod_id] = _loaded_cold(model, unknown)

    # recording what ran ------------------------------------------------------------
    def record(self, action: Action, *, changed: bool = True, lora_path: str = "") -> None:
        """Apply an action the pod accepted: ``changed`` False when it answered that it
        was in that state already ("already loaded", "not found")."""
        model = self.pods.get(action.pod)
        if model is None:
            return
        pod_id, name = action.pod, action.adapter
        if action.kind is ActionKind.UNLOAD:
            self.pinned.get(pod_id, set()).discard(name)
            if name in model.listed:
                model.unload(name)
        elif action.kind is ActionKind.WARMUP:
            if not model.serves(name):  # the pod served it: someone else loaded it
                model = self.pods[pod_id] = _loaded_cold(model, {name: lora_path})
            if model.serves(name):
                model.request(name)
        else:
            if action.pinned:
                self.pinned.setdefault(pod_id, set()).add(name)
            self._load(action, model, changed=changed, lora_path=lora_path)

    def _load(self, action: Action, model: PodResidency, *, changed: bool, lora_path: str) -> None:
        name = action.adapter
        if not changed:  # "already loaded": nothing happened on the engine
            if not model.serves(name):
                self.pods[action.pod] = _loaded_cold(model, {name: lora_path})
            return
        if name in model.listed:
            if action.inplace and model.engine is EngineModel.VLLM:
                model.load(name, lora_path, inplace=True)
                return
            model.unload(name)  # SGLang's client unloads first (or the ledger was stale)
        _load(model, name, lora_path, pinned=action.pinned)

    # what reconcile and the event preloads read ------------------------------------
    def gpu_order(self, pod_id: PodId) -> tuple[AdapterId, ...] | None:
        """What each GPU slot holds, least recently used first (None: pod not tracked).
        A slot an unloaded name's entry holds (vLLM) shows as ``?unloaded-N``, not an
        adapter name: it serves nothing, but the next activation may push it off."""
        model = self.pods.get(pod_id)
        if model is None:
            return None
        return tuple(
            AdapterId(name if listed else f"?unloaded-{index}")
            for index, (name, listed) in enumerate(model.gpu_entries())
        )

    def pins(self, pod_id: PodId) -> frozenset[AdapterId]:
        """Adapters pinned on ``pod_id``: lorafleet's, and the engine's (SGLang)."""
        model = self.pods.get(pod_id)
        engine_pins = model.pinned if model is not None else set()
        return frozenset(self.pinned.get(pod_id, set())) | {AdapterId(a) for a in engine_pins}

    # saving ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": LEDGER_FORMAT,
            "pods": {pod: SavedPod.of(model).to_dict() for pod, model in sorted(self.pods.items())},
            "pinned": {pod: sorted(names) for pod, names in sorted(self.pinned.items()) if names},
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Ledger:
        """The ledger ``to_dict`` saved. A ledger of the first format (no engine model)
        keeps only its pins: the next observation loads what each pod lists.
        Raises ``TypeError`` or ``ValueError`` on a malformed one."""
        if not isinstance(raw, Mapping):
            raise TypeError(f"a ledger is a JSON object, not {type(raw).__name__}")
        ledger = cls()
        try:
            for pod, saved in _mapping(raw.get("pods", {})).items():
                ledger.pods[PodId(_str(pod))] = SavedPod.from_dict(_mapping(saved)).build()
            for pod, names in _mapping(raw.get("pinned", {})).items():
                ledger.pinned[PodId(_str(pod))] = {AdapterId(_str(a)) for a in _list(names)}
        except (KeyError, ResidencyError) as exc:
            raise ValueError(f"not a saved ledger: {exc!r}") from None
        return ledger


def _load(model: PodResidency, name: str, path: str, *, pinned: bool = False) -> bool:
    """The engine's load, with SGLang's pin when it allows one (the pin limit reached:
    unpinned); whether it was accepted (the model may refuse what a pod accepted, a
    load past SGLang's hard cap: the next listing corrects it)."""
    pin = pinned and model.engine.is_sglang
    try:
        try:
            model.load(name, path, pinned=pin)
        except PinLimitError:
            model.load(name, path)
    except ResidencyError:
        return False
    return True


def _loaded_cold(model: PodResidency, names: Mapping[AdapterId, str]) -> PodResidency:
    """``model`` with ``names`` loaded before everything it holds: the cold end."""
    saved = SavedPod.of(model)
    known = set(model.listed)
    fresh = {n: p for n, p in names.items() if n not in known}
    rebuilt = replace(
        saved,
        listed=(*fresh.items(), *saved.listed),
        host=(*((n, True) for n in fresh), *saved.host),
        parked=tuple((n, p) for n, p in saved.parked if n not in fresh),
    )
    return rebuilt.build()


def _mapping(raw: object) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"expected a JSON object, got {type(raw).__name__}")
    return raw


def _list(raw: object) -> list[Any]:
    if not isinstance(raw, list):
        raise TypeError(f"expected a JSON list, got {type(raw).__name__}")
    return raw


def _pairs(raw: object) -> list[tuple[Any, Any]]:
    pairs = []
    for item in _list(raw):
        if len(_list(item)) != 2:
            raise ValueError(f"expected a pair, got {item!r}")
        pairs.append((item[0], item[1]))
    return pairs


def _str(raw: object) -> str:
    if not isinstance(raw, str):
        raise TypeError(f"expected a string, got {raw!r}")
    return raw


def _int(raw: object) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise TypeError(f"expected an integer, got {raw!r}")
    return raw


def _bool(raw: object) -> bool:
    if not isinstance(raw, bool):
        raise TypeError(f"expected true or false, got {raw!r}")
    return raw
