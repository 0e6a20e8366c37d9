"""Synthetic workloads: ``scenario.yaml`` parsed, request and event logs generated from it,
and public traces (ServeGen client folders) turned into request logs."""
