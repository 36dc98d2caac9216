"""Rendering of the report: HTML (:mod:`otelprof.report.html`) from the data of :mod:`otelprof.analysis.report`."""
