"""bench/router_overhead.py: the routing decision it times runs over a topology in a
state the router is in: the pre-filter's ranks those of the queues observed, as after
the scrape round ``Router.start`` runs before serving. Figures are not asserted."""

from __future__ import annotations

import random

from bench.router_overhead import decision_topology
from policies import candidates


def test_decision_topology_ranks_the_observed_queues() -> None:
    names = [f"a{i}" for i in range(200)]
    topology = decision_topology(16, names, random.Random(0))
    for view in topology.pools.values():
        index = view.index
        assert index.least_queued == candidates.least_queued(index.states, count=index.width)
        assert index.least_kv == candidates.least_kv(index.states)
    # Some queues differ, or every ranking would pass unrefreshed too.
    assert len({state.queue_len() for state in topology.pods.values()}) > 1
