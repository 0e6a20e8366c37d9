"""Benchmarks: scripts that report timings, never asserted by the test suite.

Run from the repository root. Scripts that build their problems and plans with
``tests.factories`` (solver_scale, apply_scale, router_overhead) run as modules,
``.venv/bin/python -m bench.solver_scale``; the others also run as files.
"""
