"""The controller's ledger is the engine model: fed the actions a pod accepted, it holds
what ``PodResidency`` fed the same calls holds; saved and read back, it holds and goes on
as before; each listing corrects it (unloads, restarts, loads by someone else)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.actuation.ledger import Ledger, SavedPod
from placement.domain import Action, ActionKind, AdapterId, Load, PodId, Unload, Warmup
from placement.residency import (
    AlreadyLoadedError,
    EngineModel,
    NotLoadedError,
    PodResidency,
    ResidencyError,
)
from tests.pods.pod_states import call, path_of

POD = PodId("pod-0")
NAMES = [AdapterId(f"a{i}") for i in range(6)]
ENGINES = [EngineModel.VLLM, EngineModel.SGLANG, EngineModel.SGLANG_HARD_CAP]


@st.composite
def limits(draw: st.DrawFn) -> tuple[EngineModel, int, int]:
    engine = draw(st.sampled_from(ENGINES))
    max_loras = draw(st.integers(1, 3))
    return engine, max_loras, draw(st.integers(max_loras, 5))


@st.composite
def actions(draw: st.DrawFn) -> Action:
    kind = draw(st.sampled_from(["load", "load", "warmup", "warmup", "unload", "inplace"]))
    adapter = draw(st.sampled_from(NAMES))
    if kind == "unload":
        return Unload(pod=POD, adapter=adapter, reason="")
    if kind == "warmup":
        return Warmup(pod=POD, adapter=adapter, reason="")
    pinned = draw(st.booleans()) and draw(st.booleans())
    return Load(pod=POD, adapter=adapter, reason="", pinned=pinned, inplace=kind == "inplace")


def _fresh(engine: EngineModel, max_loras: int, max_cpu_loras: int) -> tuple[PodResidency, Ledger]:
    ledger = Ledger()
    ledger.track(POD, engine=engine, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    return PodResidency(engine, max_loras=max_loras, max_cpu_loras=max_cpu_loras), ledger


def _drive(pod: PodResidency, ledger: Ledger, action: Action) -> None:
    """What apply does: the pod answers, and what it accepted is recorded ("already
    loaded" and "not found" as unchanged); after a refusal the next listing corrects
    the ledger (SGLang's in-place load may have unloaded before its load was refused)."""
    try:
        call(pod, action, sources={})
        changed = True
    except (AlreadyLoadedError, NotLoadedError) as exc:
        if isinstance(exc, NotLoadedError) and action.kind is not ActionKind.UNLOAD:
            return  # a warm-up or an in-place load the pod refused: nothing changed
        changed = False
    except ResidencyError:
        ledger.observe(
            POD,
            listed={AdapterId(a): p for a, p in pod.listed.items()},
            engine=pod.engine,
            max_loras=pod.max_loras,
            max_cpu_loras=pod.max_cpu_loras or pod.max_loras,
        )
        return
    ledger.record(action, changed=changed, lora_path=path_of(action.adapter))


def _held(pod: PodResidency) -> tuple[object, ...]:
    return (
        dict(pod.listed),
        pod.host_entries(),
        pod.gpu_entries(),
        pod.on_gpu(),
        pod.in_host(),
        frozenset(pod.pinned),
        dict(pod.parked),
    )


@settings(max_examples=200, deadline=None)
@given(limits(), st.lists(actions(), max_size=25))
def test_the_ledger_holds_what_the_engine_model_fed_the_same_calls_holds(
    pod_limits: tuple[EngineModel, int, int], steps: list[Action]
) -> None:
    pod, ledger = _fresh(*pod_limits)
    for action in steps:
        _drive(pod, ledger, action)
        assert _held(ledger.pods[POD]) == _held(pod), action


@settings(max_examples=200, deadline=None)
@given(limits(), st.lists(actions(), max_size=25), st.lists(actions(), max_size=15))
def test_a_saved_ledger_holds_and_goes_on_as_the_one_it_was_saved_from(
    pod_limits: tuple[EngineModel, int, int], before: list[Action], after: list[Action]
) -> None:
    pod, ledger = _fresh(*pod_limits)
    for action in before:
        _drive(pod, ledger, action)
    saved = json.dumps(ledger.to_dict(), sort_keys=True)
    restored = Ledger.from_dict(json.loads(saved))
    assert json.dumps(restored.to_dict(), sort_keys=True) == saved
    assert _held(restored.pods[POD]) == _held(pod)
    assert restored.pins(POD) == ledger.pins(POD)
    assert restored.gpu_order(POD) == ledger.gpu_order(POD)
    for action in after:  # the same calls do the same to both, evictions included
        twin = restored.pods[POD]
        try:
            effects = call(pod, action, sources={})
        except ResidencyError as exc:
            with pytest.raises(type(exc)):
                call(twin, action, sources={})
            continue
        assert call(twin, action, sources={}) == effects
        assert _held(twin) == _held(pod)


def _loaded(engine: EngineModel, *names: str, max_loras: int = 2, cpu: int = 4) -> Ledger:
    ledger = Ledger()
    ledger.track(POD, engine=engine, max_loras=max_loras, max_cpu_loras=cpu)
    for name in names:
        ledger.record(Load(pod=POD, adapter=AdapterId(name), reason=""), lora_path=path_of(name))
    return ledger


def _observe(ledger: Ledger, engine: EngineModel, *names: str, max_loras: int = 2) -> None:
    listed = {AdapterId(n): path_of(n) for n in names}
    ledger.observe(POD, listed=listed, engine=engine, max_loras=max_loras, max_cpu_loras=4)


@pytest.mark.parametrize(
    ("engine", "slots"),
    [
        pytest.param(EngineModel.VLLM, ("a", "?unloaded-1"), id="vllm-the-slot-stays"),
        pytest.param(EngineModel.SGLANG, ("a",), id="sglang-it-is-freed"),
    ],
)
def test_a_name_the_pod_lists_no_more_was_unloaded(
    engine: EngineModel, slots: tuple[str, ...]
) -> None:
    ledger = _loaded(engine, "a", "b")
    for name in ("a", "b"):
        ledger.record(Warmup(pod=POD, adapter=AdapterId(name), reason=""))
    _observe(ledger, engine, "a")
    model = ledger.pods[POD]
    assert (tuple(model.listed), model.on_gpu()) == (("a",), ("a",))
    assert ledger.gpu_order(POD) == slots


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pod_that_lists_none_of_its_names_restarted(engine: EngineModel) -> None:
    ledger = _loaded(engine, "a", "b")
    _observe(ledger, engine, "c")
    model = ledger.pods[POD]
    assert (tuple(model.listed), model.ghosts_on_gpu()) == (("c",), 0)
    assert model.on_gpu() == (("c",) if engine is EngineModel.VLLM else ())


def test_a_name_loaded_by_someone_else_goes_in_at_the_cold_end() -> None:
    """vLLM, two GPU slots: "c" was loaded before "a" and "b" as far as anyone knows, so
    it lost its slot to them; the next load pushes "a" off, as the engine would."""
    ledger = _loaded(EngineModel.VLLM, "a", "b")
    _observe(ledger, EngineModel.VLLM, "a", "b", "c")
    reference = PodResidency(EngineModel.VLLM, max_loras=2, max_cpu_loras=4)
    for name in ("c", "a", "b"):
        reference.load(name, path_of(name))
    assert _held(ledger.pods[POD]) == _held(reference)
    assert ledger.pods[POD].on_gpu() == ("a", "b")


def test_pins_follow_pinned_loads_and_the_listing() -> None:
    ledger = _loaded(EngineModel.SGLANG, "a")
    ledger.record(Load(pod=POD, adapter=AdapterId("p"), reason="", pinned=True))
    assert ledger.pins(POD) == {"p"} and ledger.pods[POD].pinned == {"p"}
    _observe(ledger, EngineModel.SGLANG, "a")
    assert ledger.pins(POD) == frozenset()


def test_actions_on_a_pod_not_tracked_wait_for_its_listing() -> None:
    ledger = Ledger()
    ledger.record(Load(pod=POD, adapter=AdapterId("a"), reason=""))
    assert ledger.pods == {} and ledger.gpu_order(POD) is None


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"pods": {"pod-0": {"engine": "tpu"}}}, id="unknown-engine"),
        pytest.param({"pods": {"pod-0": {"engine": "vllm"}}}, id="no-limits"),
        pytest.param({"pods": []}, id="pods-a-list"),
        pytest.param({"pinned": {"pod-0": "a"}}, id="pins-a-string"),
    ],
)
def test_a_malformed_saved_ledger_is_refused(raw: dict[str, object]) -> None:
    with pytest.raises((TypeError, ValueError)):
        Ledger.from_dict(raw)


def test_a_ledger_of_the_first_format_keeps_its_pins() -> None:
    ledger = Ledger.from_dict({"warmed": {"pod-0": ["a", "b"]}, "pinned": {"pod-0": ["p"]}})
    assert ledger.pods == {} and ledger.pins(POD) == {"p"}


def test_new_limits_keep_what_the_pod_holds() -> None:
    ledger = _loaded(EngineModel.VLLM, "a", "b", "c", max_loras=3)
    ledger.track(POD, engine=EngineModel.VLLM, max_loras=2, max_cpu_loras=4)
    assert ledger.pods[POD].on_gpu() == ("b", "c")
    assert SavedPod.of(ledger.pods[POD]).max_loras == 2
