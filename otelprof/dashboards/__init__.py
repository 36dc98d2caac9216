"""Grafana dashboards as code: Training report, Timeline, GPU & system, Ranks, and their provisioning.

Typed Python data (:mod:`otelprof.dashboards.model`) rendered to Grafana's dashboard JSON by
``otelprof generate`` into ``dashboards/`` (the default mixin config) and by ``otelprof mixin -o DIR`` (its
settings): every builder takes the :class:`~otelprof.mixin.config.MixinConfig` its panels' thresholds, windows
and selectors come from. Panel ids that alerts link to live in
:mod:`otelprof.dashboards.ids`. Importing this package has no side effects and imports nothing heavy.

May import: the catalog and configuration modules and :mod:`otelprof.mixin` (selectors, recording rules).
"""
