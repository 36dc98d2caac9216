"""The report's sections: each module renders a few related sections of the page from the report's data.

Rendering only; may import what :mod:`otelprof.report` may."""
