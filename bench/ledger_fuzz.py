"""How often the router's ledger ends up believing a vLLM pod holds what it does not.

Random runs drive one ``PodLedger`` (vLLM) and a reference pod side by side: plans seed
guesses of one to three names (hot or warm), real loads and requests arrive, guesses
are taken back (with or without a request first) and listings are read. The reference
pod is vLLM's two LRUs as POD-API.md gives them: a host cache of ``max_cpu_loras``
names (a load reads the weights there and activates them) and ``max_loras`` GPU slots;
a name dropped from the host cache leaves its slot too. Guesses never reach it (the
controller's loads they stand for did not happen).

A run is bad when, after any step, a name the ledger holds as confirmed (``is_listed``)
is in its host cache but not the pod's, or on its GPU but not the pod's. Printed: the
bad runs of each kind, out of ``--runs``, and the first few runs' seeds (rerun one with
``--seed S --trace`` to see its steps).

With ``--against-real`` a second ``PodLedger`` is fed only the real calls (loads,
requests, listings; no plan), and a run is bad when, after a step that leaves the first
ledger no guess, the two differ: the first lacks a name the second holds in its host
cache or on its GPU (too little believed), or holds one the second lacks (too much).
Without guesses left the ledger should be the one fed the real calls.

    .venv/bin/python -m bench.ledger_fuzz [--runs 20000] [--against-real] [--seed S --trace]
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field

from placement.domain import AdapterId
from placement.residency import EngineModel
from placement.router.ledger import PodLedger

NAMES = tuple(AdapterId(c) for c in "abcdefgh")
STEPS = ("seed", "load", "request", "request-guess", "forget", "listing")
WEIGHTS = (3, 3, 3, 1, 2, 1)


@dataclass
class ReferencePod:
    """vLLM's host cache and GPU slots, least recently used first."""

    gpu_slots: int
    host_slots: int
    listed: set[AdapterId] = field(default_factory=set)
    host: list[AdapterId] = field(default_factory=list)
    gpu: list[AdapterId] = field(default_factory=list)

    def load(self, name: AdapterId) -> None:
        self.listed.add(name)
        self.request(name)

    def request(self, name: AdapterId) -> None:
        if name in self.host:
            self.host.remove(name)
        elif len(self.host) >= self.host_slots:
            dropped = self.host.pop(0)
            if dropped in self.gpu:
                self.gpu.remove(dropped)
        self.host.append(name)
        if name in self.gpu:
            self.gpu.remove(name)
        elif len(self.gpu) >= self.gpu_slots:
            self.gpu.pop(0)
        self.gpu.append(name)


@dataclass(frozen=True)
class Fault:
    """Names believed wrongly: held where the reference lacks them (``host``, ``gpu``),
    and, with ``--against-real``, lacked where it holds them (``host_lacks``,
    ``gpu_lacks``)."""

    host: frozenset[AdapterId]
    gpu: frozenset[AdapterId]
    host_lacks: frozenset[AdapterId] = frozenset()
    gpu_lacks: frozenset[AdapterId] = frozenset()


def _against(ledger: PodLedger, real: PodLedger) -> Fault | None:
    """How ``ledger`` differs from ``real`` (fed only the real calls), once no guess is
    left in it; None while one is, or where they agree."""
    if any(not ledger.is_listed(AdapterId(n)) for n in ledger.residency.listed):
        return None
    host, real_host = set(ledger.registered()), set(real.registered())
    gpu, real_gpu = set(ledger.active()), set(real.active())
    fault = Fault(
        frozenset(host - real_host),
        frozenset(gpu - real_gpu),
        frozenset(real_host - host),
        frozenset(real_gpu - gpu),
    )
    return fault if fault.host or fault.gpu or fault.host_lacks or fault.gpu_lacks else None


def run(seed: int, *, trace: bool = False, against_real: bool = False) -> Fault | None:
    """One random run; the first fault it shows, or None. ``against_real``: the faults
    against a ledger fed only the real calls, in place of those against the pod."""
    rng = random.Random(seed)
    gpu_slots = rng.randint(1, 3)
    pod = ReferencePod(gpu_slots, gpu_slots + rng.randint(0, 2))
    ledger = PodLedger(EngineModel.VLLM, max_loras=pod.gpu_slots, max_cpu_loras=pod.host_slots)
    real = PodLedger(EngineModel.VLLM, max_loras=pod.gpu_slots, max_cpu_loras=pod.host_slots)
    for step in range(rng.randint(1, 20)):
        kind = rng.choices(STEPS, WEIGHTS)[0]
        name = rng.choice(NAMES)
        if kind == "seed":
            names = [n for n in rng.sample(NAMES, rng.randint(1, 3)) if n not in pod.listed]
            hot = rng.randint(0, len(names))
            ledger.seed(hot=names[:hot], warm=names[hot:], plan_id=f"plan-{step}")
            said: object = (kind, names[:hot], names[hot:])
        elif kind == "load":
            changed = name not in pod.listed
            if changed:
                pod.load(name)
            ledger.loaded(name, f"s3://{name}", changed=changed)
            real.loaded(name, f"s3://{name}", changed=changed)
            said = (kind, name, changed)
        elif kind == "request":
            if name not in pod.listed:
                continue
            pod.request(name)
            ledger.activate(name)
            real.activate(name)
            said = (kind, name)
        elif kind in ("request-guess", "forget"):
            guesses = sorted(n for n in ledger.registered() if not ledger.is_listed(n))
            if not guesses:
                continue
            guess = rng.choice(guesses)
            if kind == "request-guess":  # the pod answers "not found": taken back
                ledger.activate(guess)
            ledger.forget(guess)
            said = (kind, guess)
        else:
            listing = {n: f"s3://{n}" for n in pod.listed}
            ledger.reconcile_listing(listing)
            real.reconcile_listing(listing)
            said = (kind,)
        if trace:
            print(said, "ledger", ledger.registered(), ledger.active(), "pod", pod.host, pod.gpu)
        if against_real:
            if (fault := _against(ledger, real)) is not None:
                return fault
            continue
        host = {n for n in ledger.registered() if ledger.is_listed(n)} - set(pod.host)
        gpu = {n for n in ledger.active() if ledger.is_listed(n)} - set(pod.gpu)
        if host or gpu:
            return Fault(frozenset(host), frozenset(gpu))
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=None, help="one run, this seed")
    parser.add_argument("--trace", action="store_true", help="print each step of --seed")
    parser.add_argument(
        "--against-real", action="store_true", help="against a ledger fed only the real calls"
    )
    args = parser.parse_args(argv)
    if args.seed is not None:
        print(run(args.seed, trace=args.trace, against_real=args.against_real))
        return
    faults = {
        seed: fault
        for seed in range(args.runs)
        if (fault := run(seed, against_real=args.against_real)) is not None
    }
    counts = {
        "runs": args.runs,
        "bad": len(faults),
        "bad_host": sum(1 for f in faults.values() if f.host),
        "bad_gpu": sum(1 for f in faults.values() if f.gpu),
    }
    if args.against_real:
        counts["lacks_host"] = sum(1 for f in faults.values() if f.host_lacks)
        counts["lacks_gpu"] = sum(1 for f in faults.values() if f.gpu_lacks)
    print(json.dumps({**counts, "first_seeds": sorted(faults)[:4]}))


if __name__ == "__main__":
    main()
