"""Demand forecasting for lorafleet: pure, typed, importing nothing from placement/ or policies/.

- ``models.series``: request frames to a :class:`~models.series.CountPanel` (counts per
  adapter and bucket, cleaned), and calendars in each tenant's zone.
- ``models.base``: the :class:`~models.base.Forecaster` protocol and the one output,
  :class:`~models.base.PanelForecast` (mean, q50, q90, q99, p_nonzero per step and adapter).
- ``models.baselines``, ``models.boosting`` (global scikit-learn model), ``models.smoothing``
  (statsmodels Holt-Winters); ``models.registry.forecaster_named`` builds any of them by
  name.
- ``models.select``: ``auto``, the default: cheap experts (``models.experts``) stacked per
  adapter and horizon by a rolling-origin backtest and shrunk toward the naive forecasts
  by the evidence; changes of level (``models.shifts``) followed; bands calibrated on
  the backtest (``models.bands``); the shrink and the follow in ``models.shrink``.
- ``models.events``: pipeline transitions and tenant logins learned from the log.
- ``models.preload``: the time-of-day preload schedule.
- ``models.backtest`` and ``models.accuracy``: rolling-origin evaluation.

``placement.forecast.forecaster`` adapts domain inputs to these and back.
"""
