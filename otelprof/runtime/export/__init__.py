"""The exporters a session feeds: OTLP (:mod:`~otelprof.runtime.export.otlp`) and the Prometheus /metrics
endpoint (:mod:`~otelprof.runtime.export.prometheus`), bounded and counted. Part of the runtime core: may import
what :mod:`otelprof.runtime` may."""
