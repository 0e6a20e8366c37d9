"""The router's ledger of what each pod holds: the engine model, driven by the router's calls.

Neither vLLM nor SGLang reports GPU residency per adapter (POD-API.md), so the router
keeps its own account. It does not guess the engine's rules: each ledger is one
``placement.residency.PodResidency`` under the pool's engine, and every call the router
knows of is applied to it as the engine applies it: a load the router made (on vLLM a
load takes a GPU slot at once, evicting the least recently used), an unload the pod
reported (on vLLM it frees nothing), the plan's loads and warm-ups as the controller
makes them (warm loads first, hot loads and warm-ups last), and every routed request
(it activates its adapter). So "active" here means on the GPU as the engine would have
it, and ``registered`` means in the engine's host cache.

Each pod's ``/v1/models`` listing corrects the ledger: a name the ledger lists that the
pod does not was unloaded (or, when none of the ledger's names is left, the pod
restarted); a listed name the ledger lacks was loaded by someone else, and is applied
as a load now. Names the plan says the controller loaded stay unconfirmed until the pod
lists them or the router loads them: until then the router still asks the pod to load
them (a no-op when the controller did).

No IO, no clock: the caller owns the ledger and calls it from one event loop.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping

from placement.domain import AdapterId, Outcome
from placement.residency import (
    Busy,
    Effects,
    EngineModel,
    Entry,
    NotLoadedError,
    PinLimitError,
    PodResidency,
    ResidencyError,
)

_NOTHING = Effects()


def _holder(
    notes: Mapping[AdapterId, AdapterId], guess: AdapterId, taken_back: Collection[AdapterId]
) -> AdapterId | None:
    """The guess left holding what ``guess`` (taken back) holds in the model, where a
    guess that pushed ``guess`` out holds it (a chain of guesses, each pushing out the
    one before); None when none is left, and what ``guess`` pushed out goes back."""
    seen = {guess}
    holder = notes.get(guess)
    while holder is not None and holder in taken_back and holder not in seen:
        seen.add(holder)
        holder = notes.get(holder)
    return None if holder in taken_back else holder


class PodLedger:
    """One pod's engine state as the router knows it, with live views of its two LRUs."""

    __slots__ = (
        "_active",
        "_displaced",
        "_host_displaced",
        "_place",
        "_places",
        "_registered",
        "_seeded_hot",
        "_seeded_plan",
        "_slot_place",
        "_unconfirmed",
        "max_cpu_loras",
        "max_loras",
        "residency",
        "version",
    )

    def __init__(self, engine: EngineModel, *, max_loras: int, max_cpu_loras: int) -> None:
        self.max_loras = max(1, max_loras)
        self.max_cpu_loras = max(self.max_loras, max_cpu_loras)
        self.residency = PodResidency(
            engine, max_loras=self.max_loras, max_cpu_loras=self.max_cpu_loras
        )
        #: Mirrors of the engine model's GPU and host orders (least recently used
        #: first), kept as objects so that the views handed out stay live.
        self._active: OrderedDict[AdapterId, None] = OrderedDict()
        self._registered: OrderedDict[AdapterId, None] = OrderedDict()
        self._unconfirmed: set[AdapterId] = set()
        #: The names guesses' loads and warm-ups pushed off the GPU in the model (confirmed
        #: ones, and guesses a later guess pushed: a chain), each with the guess holding
        #: the slot: the pod holds the confirmed ones where the model holds the guesses,
        #: and a guess taken back gives its slots back to them.
        self._displaced: dict[AdapterId, AdapterId] = {}
        #: The names a guess's load or warm-up pushed out of the host cache in the model
        #: (vLLM's LRU; SGLang's soft cap parked them; guesses too, as on the GPU), the
        #: first pushed first, each with the guess that did: a guess taken back puts them
        #: back.
        self._host_displaced: dict[AdapterId, AdapterId] = {}
        #: While names are noted: each noted name's place in the pod's host order (lower
        #: is older), and that of each name put back since (``reinstate``: the model's
        #: oldest entries), until a call moves it. On the pod a name put back may be
        #: older than a noted one the model lacks, which a real call's drop must tell.
        self._place: dict[AdapterId, int] = {}
        self._places = itertools.count()
        #: The same for the GPU: each noted name's place in the pod's GPU order (lower is
        #: older), and that of each name given its slot back since (``reinstate_on_gpu``:
        #: the model's oldest slot), until a call moves it.
        self._slot_place: dict[AdapterId, int] = {}
        self._seeded_plan: str | None = None
        #: The hot set of the last plan seeded here: the GPU the controller's own ledger
        #: believes this pod holds, which decides whether its apply warms the hot set up.
        self._seeded_hot: frozenset[AdapterId] | None = None
        #: Counts the rebuilds of the mirrors (the names they hold may have changed): a
        #: reader that indexes those names (the pool's holders) re-reads them only when
        #: this moved.
        self.version = 0

    @property
    def engine(self) -> EngineModel:
        return self.residency.engine

    # what the pod holds ------------------------------------------------------------
    def classify(self, adapter: AdapterId) -> Outcome:
        """How a request for ``adapter`` admitted now would find it."""
        if adapter in self._active:
            return Outcome.GPU_HIT
        if adapter in self._registered:
            return Outcome.CPU_HIT
        return Outcome.COLD_LOAD

    def is_active(self, adapter: AdapterId) -> bool:
        return adapter in self._active

    def is_listed(self, adapter: AdapterId) -> bool:
        """Whether the pod serves the name (a request for it will not be refused)."""
        return self.residency.serves(adapter) and adapter not in self._unconfirmed

    def free_slots(self) -> int:
        """GPU slots no adapter holds (a vLLM slot of an unloaded name is not free)."""
        return self.max_loras - len(self._active) - self.residency.ghosts_on_gpu()

    def has_free_slot(self) -> bool:
        return self.free_slots() > 0

    def next_victim(self, busy: Busy = ()) -> AdapterId | None:
        """The adapter a load here would push off the GPU now, as the engine model
        chooses it: the least recently used slot neither pinned nor ``busy``, else the
        least recently used unpinned one. None with a free slot, or when that slot is
        held by an unloaded name's entry (a vLLM ghost: evicting it loses nothing).
        ``busy`` as the engine model takes it: an entry covers its own slot (what the
        engines count, by id), a name every entry of it."""
        residency = self.residency
        active = self._active
        pinned = residency.pinned
        if len(active) == self.max_loras:  # no ghost slot: the mirror has the GPU's order
            first: AdapterId | None = None
            for name in active:
                if name in pinned:
                    continue
                if name not in busy and residency.entry(name) not in busy:
                    return name
                if first is None:
                    first = name
            return first
        # A ghost slot: the engine model picks the victim by entry, as the engines count
        # a batch's adapters (by id): a name's ghosts are told apart by the entry held.
        victim = residency.gpu_victim(busy=busy)
        if victim is None or not residency.is_current(victim):
            return None
        return AdapterId(victim.name)

    def entry(self, adapter: AdapterId) -> Entry | None:
        """The engine model's entry a request for ``adapter`` sent now holds (vLLM: its
        id); None for a name the model does not list."""
        return self.residency.entry(adapter)

    def last_step(self, entry: Entry | None) -> None:
        """A request on ``entry`` ran its last step, which touched its GPU slot (and on
        vLLM its host-cache entry too) as every step does (``PodResidency.last_step``):
        an adapter is as recent as its requests' end, not their start. The mirrors
        follow; an entry off the GPU, or a ghost's, stays."""
        residency = self.residency
        residency.last_step(entry)
        if entry is not None and entry.name not in self._host_displaced:
            self._place.pop(AdapterId(entry.name), None)
        if self._slot_place and entry is not None and entry.name not in self._displaced:
            self._slot_place.pop(AdapterId(entry.name), None)
        if (
            entry is not None
            and residency.entry(entry.name) is entry
            and residency.is_on_gpu(entry.name)
        ):
            name = AdapterId(entry.name)
            self._active.move_to_end(name)
            if residency.engine is EngineModel.VLLM:  # SGLang's registry moves on arrival
                self._registered.move_to_end(name)

    @property
    def active_view(self) -> Collection[AdapterId]:
        """The adapters on GPU slots, least recently used first (a live view, not a copy)."""
        return self._active.keys()

    @property
    def registered_view(self) -> Collection[AdapterId]:
        """The adapters in the host cache (the GPU ones included), a live view."""
        return self._registered.keys()

    def active(self) -> tuple[AdapterId, ...]:
        return tuple(self._active)

    def registered(self) -> tuple[AdapterId, ...]:
        return tuple(self._registered)

    # the calls the router knows of -------------------------------------------------
    def loaded(
        self, adapter: AdapterId, lora_path: str, *, changed: bool, busy: Busy = ()
    ) -> Effects:
        """The router loaded ``adapter``: ``changed`` when the pod loaded it now, False
        when it answered that it had it already. A guess loaded now was not on the pod:
        it is taken back first (what it pushed out in the model never left), then loaded."""
        if changed and adapter in self._unconfirmed:
            self._take_back((adapter,))
        self._confirmed(adapter)
        if not changed and self.residency.serves(adapter):
            return _NOTHING  # nothing happened on the engine: its places stay
        if adapter not in self._host_displaced:  # the newest entry now, where it was put back
            self._place.pop(adapter, None)
        if adapter not in self._displaced:
            self._slot_place.pop(adapter, None)
        if changed and self.residency.serves(adapter):
            effects = self._reload(adapter, lora_path, busy=busy)
        else:
            effects = self._load(adapter, lora_path, busy=busy)
        self._pushed_for_real(adapter, effects)
        self._sync()
        return effects

    def activate(self, adapter: AdapterId, *, busy: Busy = ()) -> Effects:
        """A request (or a warm-up) for ``adapter`` was sent to the pod."""
        residency = self.residency
        if adapter not in self._host_displaced:  # it is the newest entry now
            self._place.pop(adapter, None)
        if self._slot_place and adapter not in self._displaced:
            self._slot_place.pop(adapter, None)
        was_active = adapter in self._active
        if was_active and residency.touch(adapter):  # a GPU hit: both LRUs refreshed
            self._active.move_to_end(adapter)
            self._registered.move_to_end(adapter)
            return _NOTHING
        loaded = False
        try:
            effects = residency.request(adapter, busy=busy)
        except NotLoadedError:  # loaded by someone else since the last listing
            self._pushed_for_real(adapter, self._load(adapter, "", busy=busy))
            if not residency.serves(adapter):
                return _NOTHING
            loaded = True
            effects = residency.request(adapter, busy=busy)
        if adapter in self._unconfirmed:  # a guess's request: what it pushes out is a guess
            self._pushed_by(adapter, effects)
        else:
            self._pushed_for_real(adapter, effects)
        if was_active and effects == _NOTHING:
            self._active.move_to_end(adapter)  # a GPU hit only refreshes both LRUs
            self._registered.move_to_end(adapter)
        elif (
            loaded
            or effects.cold
            or effects.host_evicted
            or effects.unlisted
            or adapter not in self._registered
        ):
            self._sync()
        else:
            self._activated(adapter, effects.gpu_evicted)
        return effects

    def _activated(self, adapter: AdapterId, gpu_evicted: tuple[str, ...]) -> None:
        """A host-cache hit went to the GPU: the mirrors follow without a rebuild (the
        engine moved the adapter's entry last in both orders and took the victims off
        the GPU only; they stay in host memory). No name entered or left the host
        cache, so the version (what indexes of the held names follow) stays."""
        residency = self.residency
        for name in gpu_evicted:
            # A vLLM ghost's slot (an unloaded name's old entry) may carry a name whose
            # current entry is still on the GPU.
            if not residency.is_on_gpu(name):
                self._active.pop(AdapterId(name), None)
        self._active[adapter] = None
        self._active.move_to_end(adapter)
        self._registered.move_to_end(adapter)

    def forget(self, adapter: AdapterId) -> None:
        """The pod does not have the name (it answered "not found" or "not loaded"). A
        guess (a plan's load the pod never listed) is taken back (``_take_back``)."""
        if adapter in self._unconfirmed:
            self._take_back((adapter,))
            return
        residency = self.residency
        if adapter in residency.listed:
            residency.unload(adapter)
        elif adapter in residency.parked:  # SGLang forgot a parked name too (a restart)
            del residency.parked[adapter]
        else:
            return
        self._sync()

    def clear(self) -> None:
        """The pod restarted empty."""
        self.residency.restart()
        self._unconfirmed.clear()
        self._displaced.clear()
        self._host_displaced.clear()
        self._place.clear()
        self._slot_place.clear()
        self._sync()

    def _take_back(self, guesses: Iterable[AdapterId]) -> None:
        """Guesses the pod never had leave the model without a ghost
        (``PodResidency.withdraw``): on the pod the confirmed names they pushed out never
        left. Those pushed out of the host cache go back first, as its oldest entries in
        the order they were (``PodResidency.reinstate``), the last pushed first as far as
        the cache has room (a guess whose own entry left it frees none); those pushed off
        the GPU then take the slots back, the first pushed first, as far as slots are
        free, each behind those given back before it that were older on the pod
        (``_slot_place``), if their weights are in the host cache (else they left it for
        real, and the GPU with it; a request here would read them again), or wait for
        the guess their weights wait on.

        A guess pushed out by another is noted as a confirmed name is (a chain): taken
        back, the later guess puts the earlier one back, and a guess taken back whose
        own place another guess took leaves what it pushed out to that guess
        (``_holder``): on the pod, without the guesses, those names are where the
        remaining guess holds the place."""
        residency = self.residency
        pushed: list[AdapterId] = []
        taken_back: set[AdapterId] = set()
        for adapter in guesses:
            self._unconfirmed.discard(adapter)
            residency.withdraw(adapter)
            taken_back.add(adapter)
        slots = self._displaced
        slot_place = self._slot_place
        for adapter, guess in list(slots.items()):
            if adapter in taken_back:
                del slots[adapter]
                slot_place.pop(adapter, None)
            elif guess in taken_back:
                holder = _holder(slots, guess, taken_back)
                if holder is None:
                    del slots[adapter]
                    pushed.append(adapter)
                else:
                    slots[adapter] = holder
        host = self._host_displaced
        place = self._place
        back_in = []
        for adapter, guess in list(host.items()):
            if adapter in taken_back:
                del host[adapter]
                place.pop(adapter, None)
            elif guess in taken_back:
                holder = _holder(host, guess, taken_back)
                if holder is None:
                    back_in.append(adapter)
                else:
                    host[adapter] = holder
        back_in.sort(key=place.__getitem__)
        for adapter in reversed(back_in):  # each the oldest, behind those older on the pod
            del host[adapter]
            here = place[adapter]
            behind = 0
            for name, current in residency.host_entries():
                older = place.get(AdapterId(name))
                if not current or older is None or older > here or name in host:
                    break
                behind += 1
            if not residency.reinstate(adapter, behind=behind):
                del place[adapter]
        free = self.max_loras - residency.ghosts_on_gpu() - len(residency.on_gpu())
        back: list[AdapterId] = []
        waiting: list[AdapterId] = []
        for adapter in pushed:
            if adapter in back or not residency.serves(adapter) or residency.is_on_gpu(adapter):
                continue
            if residency.is_in_host(adapter):
                (back if len(back) < free else waiting).append(adapter)
            elif adapter in host:  # its weights wait on another guess: its slot too
                slots[adapter] = host[adapter]
        # No slot free for these: a later guess took the one the model had free, which
        # on the pod the name holds.
        free_guesses = self._free_guesses(residency.on_gpu(), slots)
        for adapter, guess in zip(waiting, free_guesses, strict=False):
            slots[adapter] = guess
        back.sort(key=lambda name: slot_place.get(name, -1))
        for adapter in reversed(back):  # each the oldest, behind those older on the pod
            here = slot_place.get(adapter, -1)
            behind = 0
            for name, current in residency.gpu_entries():
                older = slot_place.get(AdapterId(name))
                if not current or older is None or older > here or name in slots:
                    break
                behind += 1
            residency.reinstate_on_gpu(adapter, behind=behind)
        for adapter in [a for a in slot_place if a not in slots and a not in back]:
            if not residency.is_on_gpu(adapter):
                del slot_place[adapter]
        self._sync()

    def seed(
        self,
        *,
        hot: Iterable[AdapterId],
        warm: Iterable[AdapterId],
        pinned: Iterable[AdapterId] = (),
        plan_id: str | None = None,
    ) -> None:
        """Apply what the controller does for a plan, in the order its apply runs: warm
        loads first, then hot loads (``pinned`` ones pinned, on SGLang), then a warm-up
        of each hot adapter when the apply would run one (``hot_phase`` in
        ``actuation.reconcile_replay``): the controller's own ledger sees only its own
        actions, so it activates the hot set again when the plan's hot set here gained a
        name since the last plan seeded, or (vLLM) a load is due, and at the first plan
        this ledger sees; a hot set the last plan had, all of it listed, is left as the
        traffic left it. Names loaded here stay unconfirmed until the pod lists them. A
        plan already seeded (same ``plan_id``) is not applied twice."""
        if plan_id is not None and plan_id == self._seeded_plan:
            return
        self._seeded_plan = plan_id
        hot, warm = tuple(hot), tuple(warm)
        pins = frozenset(pinned)
        before = self._seeded_hot
        self._seeded_hot = frozenset(hot)
        vllm = self.engine is EngineModel.VLLM  # its loads take GPU slots
        loads = vllm and any(not self.residency.serves(a) for a in (*warm, *hot))
        warms_up = before is None or loads or not self._seeded_hot <= before
        for adapter in (a for a in warm if a not in hot):
            self._pushed_by(adapter, self._expect_load(adapter, pinned=False))
        for adapter in hot:
            self._pushed_by(adapter, self._expect_load(adapter, pinned=adapter in pins))
        if warms_up:
            for adapter in hot:
                if self.residency.serves(adapter):
                    self._pushed_by(adapter, self.residency.request(adapter))
        self._sync()

    def reconcile_listing(self, listed: Mapping[AdapterId, str]) -> None:
        """Correct the ledger from the pod's ``/v1/models``: the names it lists now, with
        their paths. A listed name missing now was unloaded (on vLLM its slot stays, a
        ghost); a guess the pod never listed (a plan's load it has not made) is taken back
        and leaves no ghost: a fresh pod the plan's loads have not reached reads empty."""
        residency = self.residency
        confirmed = [a for a in residency.listed if a not in self._unconfirmed]
        missing = [a for a in residency.listed if a not in listed]
        if confirmed and all(a not in listed for a in confirmed):
            residency.restart()  # none of the names the pod had confirmed is left
            self._unconfirmed.clear()
            self._displaced.clear()
            self._host_displaced.clear()
            self._place.clear()
            self._slot_place.clear()
        else:
            host = self._host_displaced
            for name in [a for a in host if a not in listed]:
                del host[name]  # what a guess pushed out that the pod lacks is gone
                self._place.pop(name, None)
            guesses = [a for a in missing if a in self._unconfirmed]
            for adapter in missing:
                if adapter not in self._unconfirmed:
                    self.forget(AdapterId(adapter))
            # The plan's guesses the pod does not list, parked ones (SGLang's soft cap
            # in the model) too: the pod never had them.
            guesses += [a for a in residency.parked if a in self._unconfirmed and a not in listed]
            if guesses:
                self._take_back(AdapterId(a) for a in guesses)
        for adapter in sorted(listed):
            self._confirmed(adapter)
            if adapter in residency.listed:
                continue
            if adapter in residency.parked:  # SGLang: a request brought it back
                effects = residency.request(adapter)
            else:
                effects = self._load(adapter, listed[adapter])
            self._pushed_for_real(adapter, effects)
        self._sync()

    # the engine model --------------------------------------------------------------
    def _load(self, adapter: AdapterId, lora_path: str, *, busy: Busy = ()) -> Effects:
        try:
            return self.residency.load(adapter, lora_path, busy=busy)
        except ResidencyError:  # SGLang before the soft cap refused it: nothing changed
            return _NOTHING

    def _reload(self, adapter: AdapterId, lora_path: str, *, busy: Busy) -> Effects:
        """A load answered "loaded now" for a name the ledger already had: the ledger's
        entry was a guess (the plan's) or stale, and the pod read the weights anew."""
        if adapter in self.residency.listed:
            if self.engine is EngineModel.VLLM:
                return self.residency.load(adapter, lora_path, inplace=True, busy=busy)
            self.residency.unload(adapter)
        return self._load(adapter, lora_path, busy=busy)  # SGLang: a parked name loads anew

    def _expect_load(self, adapter: AdapterId, *, pinned: bool) -> Effects:
        if self.residency.serves(adapter):
            return _NOTHING
        pin = pinned and self.engine is not EngineModel.VLLM
        try:
            try:
                effects = self.residency.load(adapter, "", pinned=pin)
            except PinLimitError:  # pins full: the load unpinned, which a full cap refuses
                effects = self.residency.load(adapter, "")
        except ResidencyError:
            return _NOTHING
        self._unconfirmed.add(adapter)
        return effects

    def _pushed_by(self, adapter: AdapterId, effects: Effects) -> None:
        """Note the names a guess's load or warm-up pushed off the GPU, and out of the
        host cache (SGLang: those its soft cap parked), other guesses too (a chain, which
        ``_take_back`` unwinds); a guess brought back itself is noted no more."""
        if adapter not in self._unconfirmed:
            return
        slots = self._displaced
        slot_place = self._slot_place
        if not slots:
            slot_place.clear()  # with nothing noted the pod's order is the model's
        slots.pop(adapter, None)
        slot_place.pop(adapter, None)
        for name in map(AdapterId, effects.gpu_evicted):
            if name != adapter and not self.residency.is_on_gpu(name):
                slots.pop(name, None)
                slots[name] = adapter
                if name not in slot_place:  # a name given its slot back keeps its place
                    slot_place[name] = next(self._places)
        place = self._place
        if not self._host_displaced:
            place.clear()  # with nothing noted the pod's order is the model's
        host = self._host_displaced
        if adapter in host and self.residency.is_in_host(adapter):
            del host[adapter]  # a guess pushed out by another, read again
            place.pop(adapter, None)
        for name in map(AdapterId, effects.host_evicted + effects.unlisted):
            if name != adapter and self._pushed_out(name, guesses_too=True):
                host[name] = adapter
                if name not in place:  # a name put back keeps its place
                    place[name] = next(self._places)
            elif name not in host:  # not a ghost of a noted name
                place.pop(name, None)

    def _free_guesses(
        self, names: Iterable[str], notes: Mapping[AdapterId, AdapterId]
    ) -> list[AdapterId]:
        """The guesses among ``names`` (the model's GPU or host order) that hold no
        confirmed name's place in ``notes``: each took a place the model had free, and
        so one the pod has free or a noted name holds there."""
        unconfirmed = self._unconfirmed
        held = {guess for name, guess in notes.items() if name not in unconfirmed}
        return [AdapterId(n) for n in names if n in unconfirmed and n not in held]

    def _pushed_out(self, name: AdapterId, *, guesses_too: bool = False) -> bool:
        """Whether a name the model dropped from the host cache is a confirmed one, to be
        put back: not a guess, and not a vLLM ghost (an unloaded name's old entry, which
        may carry a name whose current entry is still in the host cache)."""
        residency = self.residency
        return (
            (guesses_too or name not in self._unconfirmed)
            and residency.serves(name)
            and not residency.is_in_host(name)
        )

    def _confirmed(self, adapter: AdapterId) -> None:
        """``adapter`` is on the pod (listed, or the router loaded it): a guess no more,
        and what it pushed out is gone for real."""
        self._unconfirmed.discard(adapter)
        slots = self._displaced
        if slots and adapter in slots.values():
            for name in [n for n, guess in slots.items() if guess == adapter]:
                del slots[name]
        host = self._host_displaced
        if host and adapter in host.values():
            for name in [n for n, guess in host.items() if guess == adapter]:
                del host[name]
                self._place.pop(name, None)

    def _pushed_for_real(self, adapter: AdapterId, effects: Effects) -> None:
        """A call the pod made too (a load, a request) for ``adapter``, with ``effects``
        in the model, while guesses' pushed-out names are noted: the pod's host cache
        holds those names where the model holds the guesses, so a name the model drops
        here is one the pod keeps, and the pod drops instead the oldest noted name (a
        real load pushed it out), or nothing where the call brought a noted name back (a
        cold read in the model, a hit on the pod). The kept name takes the dropped one's
        guess, to be put back with it; a guess the model drops is no name the pod keeps.
        Only a name put back older on the pod than every noted one (``_place``) is
        dropped there too, with no note changed."""
        if self._host_displaced:
            self._host_for_real(adapter, effects)
        elif self._place:
            self._place.clear()  # with nothing noted the pod's order is the model's
        if self._displaced:
            self._slots_for_real(adapter, effects)
        elif self._slot_place:
            self._slot_place.clear()

    def _host_for_real(self, adapter: AdapterId, effects: Effects) -> None:
        """The host side of ``_pushed_for_real``, while names are noted. A noted name
        the pod drops leaves its GPU slot there too (vLLM deactivates what its host
        cache drops); a noted guess is no name the pod holds, so none it drops."""
        host = self._host_displaced
        place = self._place
        back = adapter in host and self.residency.is_in_host(adapter)
        guesses = [host.pop(adapter)] if back else []
        if back:
            place.pop(adapter, None)
        for name in map(AdapterId, effects.host_evicted + effects.unlisted):
            # A name put back: its place on the pod (a ghost of a noted name has none).
            own = None if name in host else place.pop(name, None)
            if not guesses:
                real = [n for n in host if n not in self._unconfirmed]
                if not real:
                    break
                oldest = min(real, key=place.__getitem__)
                if own is not None and own < place[oldest]:
                    continue  # older on the pod than every noted name: dropped there too
                guesses.append(host.pop(oldest))
                del place[oldest]
                if self._displaced.pop(oldest, None) is not None:
                    self._slot_place.pop(oldest, None)
            guess = guesses.pop()
            if self._pushed_out(name):
                host[name] = guess
                place[name] = own if own is not None else next(self._places)

    def _slots_for_real(self, adapter: AdapterId, effects: Effects) -> None:
        """The GPU side of ``_pushed_for_real``: the pod's slots hold the noted names
        (``_displaced``) where the model's hold the guesses, and the noted names are the
        pod's least recently used, so where the model pushes a listed name off the GPU
        the pod pushes off the oldest noted one, and keeps the model's: that name takes
        the dropped one's guess, as the newest noted. A call that brought a noted name
        back on the GPU in the model (a hit on the pod) drops nothing there: the name the
        model pushed off takes its guess. A guess the model pushes off is no name the pod
        keeps; a vLLM ghost's slot (an entry no listed name points to) is left alone.
        Where the pod's slots then hold more than it has (the model took a slot that a
        guess taken back left free, which the pod's noted name holds), the pod pushed off
        its oldest noted names."""
        slots = self._displaced
        place = self._slot_place
        residency = self.residency
        guesses = []
        if adapter in slots and residency.is_on_gpu(adapter):
            guesses.append(slots.pop(adapter))
            place.pop(adapter, None)
        for name in map(AdapterId, effects.gpu_evicted):
            if not residency.serves(name) or residency.is_on_gpu(name):
                continue
            own = None if name in slots else place.pop(name, None)
            if not guesses:
                real = [n for n in slots if n not in self._unconfirmed]
                if not real:
                    break
                oldest = min(real, key=place.__getitem__)
                if own is not None and own < place[oldest]:
                    continue  # older on the pod than every noted name: dropped there too
                guesses.append(slots.pop(oldest))
                del place[oldest]
            guess = guesses.pop()
            if name not in self._unconfirmed:
                slots[name] = guess
                place[name] = own if own is not None else next(self._places)
        unconfirmed = self._unconfirmed
        real = [n for n in slots if n not in unconfirmed]
        on_gpu = [AdapterId(n) for n in residency.on_gpu() if n not in unconfirmed]
        over = len(on_gpu) + len(real) + residency.ghosts_on_gpu() - self.max_loras
        if over <= 0:
            return
        # Pushed off on the pod, where the model had a free slot: the oldest there, a
        # noted name or one given its slot back (newer are those a call moved since).
        real += [n for n in on_gpu if n in place]
        for oldest in sorted(real, key=place.__getitem__)[:over]:
            del place[oldest]
            if slots.pop(oldest, None) is None and residency.deactivate(oldest):
                self._sync()

    def _sync(self) -> None:
        """Rebuild the mirrors in place from the engine model."""
        self.version += 1
        self._active.clear()
        self._active.update((AdapterId(a), None) for a in self.residency.on_gpu())
        self._registered.clear()
        self._registered.update((AdapterId(a), None) for a in self.residency.in_host())
