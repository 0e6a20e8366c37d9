"""The modules that talk to the outside systems the decisions are fed from and acted
through. (The router's data path does its own IO for speed: ``router.upstream``,
``router.scrape_http``, its plan and pod sources and the workers' shared files.)

One real adapter per port of ``placement.ports``: the vLLM and SGLang engine clients,
Kubernetes, a state directory on one machine, Prometheus; and in-memory twins of the
cluster ports for tests and single-machine runs.
"""
