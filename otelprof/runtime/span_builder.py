"""Finished spans built directly as SDK ``ReadableSpan``s, for steps and regions that already ended.

``Tracer.start_span()`` + ``end()`` costs ~17 us a span here (contexts, the sampler, attribute
cleaning, span processors); a ``ReadableSpan`` made from known times costs ~1.5 us. The spans
keep what the SDK would give them: the provider's resource, its id generator and, when
``OTEL_TRACES_SAMPLER`` set a sampler other than the default, its decision for each trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from otelprof import semconv as sc
from otelprof._version import __version__

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_DEFAULT_SAMPLER = ParentBased(ALWAYS_ON).get_description()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class StepSpan:
    """A traced step of a profiling window: its span context and its times in Unix ns (the recorder makes
    them; the operator spans of the window are parented under them)."""

    context: SpanContext
    number: int
    start_ns: int
    end_ns: int


class SpanBuilder:
    """Makes ended spans under one provider's resource and otelprof's versioned instrumentation scope."""

    def __init__(self, provider: TracerProvider) -> None:
        self.resource = provider.resource
        self.scope = InstrumentationScope(sc.SCOPE_NAME, __version__, sc.SCHEMA_URL)
        self._ids = provider.id_generator
        sampler = provider.sampler
        self._sampler = None if sampler.get_description() == _DEFAULT_SAMPLER else sampler  # type: ignore[no-untyped-call]

    def new_trace(self, name: str, attributes: Mapping[str, Any]) -> SpanContext | None:
        """The context of a new root span, or None when the configured sampler drops this trace."""
        trace_id = self._ids.generate_trace_id()
        if self._sampler is not None:
            decision = self._sampler.should_sample(None, trace_id, name, SpanKind.INTERNAL, attributes)
            if not decision.decision.is_sampled():  # type: ignore[no-untyped-call]
                return None
        return SpanContext(trace_id, self._ids.generate_span_id(), False, _SAMPLED)

    def child_context(self, parent: SpanContext) -> SpanContext:
        return SpanContext(parent.trace_id, self._ids.generate_span_id(), False, _SAMPLED)

    def span(self, name: str, context: SpanContext, parent: SpanContext | None, start_ns: int, end_ns: int,
             attributes: Mapping[str, Any], events: Sequence[Event] = ()) -> ReadableSpan:
        """An ended INTERNAL span with status UNSET."""
        return ReadableSpan(name, context, parent, self.resource, attributes, events, kind=SpanKind.INTERNAL,
                            status=_UNSET, start_time=start_ns, end_time=end_ns, instrumentation_scope=self.scope)
