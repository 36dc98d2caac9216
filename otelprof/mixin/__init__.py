"""otelprof's Prometheus mixin: alert and recording rules as Python data, one config, a generator.

>>> from otelprof.mixin import MixinConfig, render_all
>>> files = render_all(MixinConfig(selector='namespace="ml"'))

Owns the alert and recording rules, their promtool tests, the Alertmanager routing, the Kubernetes copies
(:mod:`~otelprof.mixin.deploy`) and the bundle. May import: the catalog and configuration modules and
:mod:`otelprof.dashboards` (panel ids, the dashboards of the bundle).
"""

from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import render_all, write

__all__ = ["MixinConfig", "render_all", "write"]
