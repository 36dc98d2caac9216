"""Rendering of the report: HTML (:mod:`otelprof.report.html`, its sections in :mod:`otelprof.report.sections`)
from the data of :mod:`otelprof.analysis.report`, and the Perfetto timeline (:mod:`otelprof.report.timeline`) of a
recording.

Rendering only. May import: what :mod:`otelprof.analysis` may, and :mod:`otelprof.analysis`. Never the runtime."""
