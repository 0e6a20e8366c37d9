"""The replay simulator: a discrete-event fleet model on an accelerated clock.

``workload`` turns a request log into columns, ``engine`` models pods and loads
(``FleetReplay``), ``routers`` adapts the pure policies of ``policies/`` to it,
``planning`` lets the ``lorafleet`` and ``oracle`` policies plan through the
controller's ports (``DemandForecaster``, ``Planner``) to a ``Plan``, ``wiring`` builds
that planning from the project's forecaster and solver, ``figures`` computes the
figures and ``replay`` runs several policies on the same requests.
"""
