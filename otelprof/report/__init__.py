"""Rendering only: the HTML report (:mod:`otelprof.report.html`) from the data of :mod:`otelprof.analysis.report`,
and the Perfetto timeline (:mod:`otelprof.report.timeline`) of a recording.

May import: what :mod:`otelprof.analysis` may, and :mod:`otelprof.analysis`. Never the runtime."""
