"""The replay simulator: a discrete-event fleet model on an accelerated clock.

``workload`` turns a request log into columns, ``engine`` models pods and loads,
``routers`` adapts the pure policies of ``policies/`` to it, ``planning`` holds the
replanning interface of the ``lorafleet`` and ``oracle`` policies, ``metrics`` the
figures and ``replay`` runs several policies on the same requests.
"""
