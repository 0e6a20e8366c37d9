"""The only modules that talk to outside systems over the network or the disk.

One real adapter per port of ``placement.ports``: the vLLM and SGLang engine clients,
Kubernetes, a state directory on one machine, Prometheus; and in-memory twins of the
cluster ports for tests and single-machine runs.
"""
