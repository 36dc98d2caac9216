"""The runtime core: what runs inside the training process, whatever the framework.

The hot path (:mod:`~otelprof.runtime.hotpath`: ``step``/``phase``/``annotate``/``record``), the recorder that turns
its records into aggregates, spans and recording lines off the hot path (:mod:`~otelprof.runtime.recorder`, with
:mod:`~otelprof.runtime.metrics` and :mod:`~otelprof.runtime.span_builder`), the session that wires them to the
exporters (:mod:`~otelprof.runtime.session`, :mod:`~otelprof.runtime.resource`, :mod:`~otelprof.runtime._sigterm`),
the system sampler (:mod:`otelprof.runtime.collectors`), the exporters (:mod:`otelprof.runtime.export`), the
control endpoint and the small HTTP servers (:mod:`~otelprof.runtime.control`, :mod:`~otelprof.runtime._http`).

May import: the catalog and configuration modules at the top of ``otelprof``, :mod:`otelprof.recording` and
:mod:`otelprof.shared`. Never an integration, the command line, the analysis, the report or the mixin: an
integration that must live as long as a session registers with :mod:`~otelprof.runtime.extensions`.
"""
