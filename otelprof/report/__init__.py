"""Rendering of the report: HTML (:mod:`otelprof.report.html`, its sections in :mod:`otelprof.report.sections`)
from the data of :mod:`otelprof.analysis.report`."""
