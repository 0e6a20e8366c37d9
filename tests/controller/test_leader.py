"""Leader election: two controllers against one fake API server never both act."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from placement.adapters.kube import KubeLeaseStore, KubeTarget, connect
from placement.adapters.kube_memory import MemoryLeaseStore
from placement.controller.leader import LeaderElector, LeaseMove, Sighting, decide
from placement.errors import RetryableKubeError
from placement.ports import LeaseRecord, LeaseStore
from tests.controller.controller_kubefake import FakeApiServer
from tests.factories import FakeClock

DURATION_S = 15
RENEW_DEADLINE_S = 10.0
TICK_S = 5.0


@pytest.fixture
def second_api(fake_api: FakeApiServer) -> Iterator[client.ApiClient]:
    api = connect(host=fake_api.url)
    yield api
    api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated


def elector(store: LeaseStore, name: str, clock: FakeClock) -> LeaderElector:
    return LeaderElector(
        store,
        identity=name,
        duration_s=DURATION_S,
        renew_deadline_s=RENEW_DEADLINE_S,
        clock=clock,
        wall=clock.wall,
    )


@pytest.fixture
def pair(
    kube_api: client.ApiClient, second_api: client.ApiClient, target: KubeTarget, clock: FakeClock
) -> tuple[LeaderElector, LeaderElector]:
    """Two controllers, each with its own API client, against one fake API server."""
    a = elector(KubeLeaseStore(kube_api, target=target), "controller-a", clock)
    b = elector(KubeLeaseStore(second_api, target=target), "controller-b", clock)
    return a, b


def test_first_comer_acquires_and_the_other_waits(
    pair: tuple[LeaderElector, LeaderElector], clock: FakeClock, fake_api: FakeApiServer
) -> None:
    a, b = pair
    assert a.tick() is True
    for _ in range(12):  # a minute of renewals: b never acts
        clock.advance(TICK_S)
        assert a.tick() is True
        assert b.tick() is False
    lease = fake_api.get("leases", "lorafleet-controller")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "controller-a"
    assert lease["spec"]["leaseDurationSeconds"] == DURATION_S


def test_standby_takes_over_within_the_lease_duration_when_renewals_stop(
    pair: tuple[LeaderElector, LeaderElector], clock: FakeClock, fake_api: FakeApiServer
) -> None:
    a, b = pair
    a.tick()
    b.tick()
    clock.advance(TICK_S)
    a.tick()  # a's last renewal
    last_renewal_s = clock()
    b.tick()
    took_over_at_s = None
    while clock() - last_renewal_s <= DURATION_S + TICK_S:
        clock.advance(TICK_S)
        leader_b = b.tick()
        assert not (a.is_leader() and leader_b), "two leaders at once"
        if leader_b and took_over_at_s is None:
            took_over_at_s = clock()
    assert took_over_at_s is not None
    assert took_over_at_s - last_renewal_s <= DURATION_S + TICK_S
    lease = fake_api.get("leases", "lorafleet-controller")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "controller-b"
    assert lease["spec"]["leaseTransitions"] == 1
    # the old leader comes back: it sees b holding the lease and stands by
    assert a.tick() is False


def test_released_lease_is_taken_at_once(
    pair: tuple[LeaderElector, LeaderElector], clock: FakeClock
) -> None:
    a, b = pair
    a.tick()
    b.tick()
    a.release()
    assert a.is_leader() is False
    assert b.tick() is True


def test_a_conflict_on_renewal_ends_leadership_at_once(
    pair: tuple[LeaderElector, LeaderElector], clock: FakeClock, fake_api: FakeApiServer
) -> None:
    a, _ = pair
    a.tick()
    clock.advance(TICK_S)
    fake_api.inject("PUT", "leases", 409)
    assert a.tick() is False
    clock.advance(TICK_S)
    assert a.tick() is True  # still the recorded holder: it renews again


def test_server_errors_keep_leadership_only_until_the_renew_deadline(
    pair: tuple[LeaderElector, LeaderElector], clock: FakeClock, fake_api: FakeApiServer
) -> None:
    a, _ = pair
    a.tick()
    fake_api.inject("GET", "leases", 500, times=3)
    clock.advance(TICK_S)
    assert a.tick() is True  # 5 s since the last renewal: within the 10 s deadline
    clock.advance(TICK_S)
    assert a.tick() is False  # 10 s: past the deadline, stop acting
    clock.advance(TICK_S)
    assert a.tick() is False
    clock.advance(TICK_S)
    assert a.tick() is True  # the API is back: renewed


def test_clock_jumping_back_does_not_extend_leadership(
    pair: tuple[LeaderElector, LeaderElector], clock: FakeClock, fake_api: FakeApiServer
) -> None:
    a, _ = pair
    a.tick()
    clock.advance(-3600)
    assert a.is_leader() is False


@pytest.mark.parametrize("backend", ["memory", "kube"])
def test_lease_store_contract(backend: str, kube_api: client.ApiClient, target: KubeTarget) -> None:
    from placement.errors import KubeConflictError

    store: LeaseStore = (
        MemoryLeaseStore() if backend == "memory" else KubeLeaseStore(kube_api, target=target)
    )
    assert store.read() is None
    first = store.create(LeaseRecord(holder="x", duration_s=10))
    with pytest.raises(KubeConflictError):
        store.create(LeaseRecord(holder="y", duration_s=10))
    second = store.replace(LeaseRecord(holder="y", duration_s=10, version=first.version))
    with pytest.raises(KubeConflictError):
        store.replace(LeaseRecord(holder="z", duration_s=10, version=first.version))
    read = store.read()
    assert read is not None
    assert (read.holder, read.version) == ("y", second.version)


def test_memory_store_faults_are_retryable_errors(clock: FakeClock) -> None:
    store = MemoryLeaseStore()
    a = elector(store, "a", clock)
    store.faults.queued.append(RetryableKubeError("boom", status=500))
    assert a.tick() is False
    assert a.tick() is True


@pytest.mark.parametrize(
    ("record", "sighting", "now_s", "move"),
    [
        pytest.param(None, None, 0.0, LeaseMove.CREATE, id="no-lease"),
        pytest.param(
            LeaseRecord(holder="me", duration_s=15), None, 0.0, LeaseMove.RENEW, id="mine"
        ),
        pytest.param(
            LeaseRecord(holder=None, duration_s=15), None, 0.0, LeaseMove.TAKE_OVER, id="free"
        ),
        pytest.param(
            LeaseRecord(holder="other", duration_s=15, version="7"),
            Sighting(version="7", holder="other", renewed_at=None, seen_at_s=100.0),
            114.9,
            LeaseMove.WAIT,
            id="other-fresh",
        ),
        pytest.param(
            LeaseRecord(holder="other", duration_s=15, version="7"),
            Sighting(version="7", holder="other", renewed_at=None, seen_at_s=100.0),
            115.0,
            LeaseMove.TAKE_OVER,
            id="other-expired",
        ),
        pytest.param(
            LeaseRecord(holder="other", duration_s=15, version="7"),
            None,
            1e9,
            LeaseMove.WAIT,
            id="other-never-seen",
        ),
    ],
)
def test_decide(
    record: LeaseRecord | None, sighting: Sighting | None, now_s: float, move: LeaseMove
) -> None:
    assert decide(record, sighting, identity="me", now_s=now_s) is move
