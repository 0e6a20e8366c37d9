"""Demand: request logs to ``models/`` and back, demand for a plan window, event preloads.

``forecaster`` adapts domain inputs to the ``models/`` forecasters; ``demand`` turns a
forecast (or a log) into the solver's per-adapter demand; ``event_preloads`` decides
what a pipeline or login event is worth loading. Pure but for reading frames given.
"""
