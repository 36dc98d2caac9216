"""Offline analysis of run recordings: each topic its own module returning frozen results.

Reads only a recording (:mod:`otelprof.recording`) or Prometheus's HTTP API (:mod:`~otelprof.analysis.prometheus`).
May import: the catalog and configuration modules, :mod:`otelprof.recording`, :mod:`otelprof.shared` (the
judgements the process makes too) and :mod:`otelprof.mixin` (thresholds, alert definitions). Never the runtime.
"""
