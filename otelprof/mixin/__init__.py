"""otelprof's Prometheus mixin: alert and recording rules as Python data, one config, a generator.

>>> from otelprof.mixin import MixinConfig, render_all
>>> files = render_all(MixinConfig(selector='namespace="ml"'))
"""

from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import render_all, write

__all__ = ["MixinConfig", "render_all", "write"]
