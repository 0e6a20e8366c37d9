"""Synthetic workloads: ``scenario.yaml`` parsed, and request logs generated from it."""
