"""The recording's OTLP-JSON: the direct span encoder parses back to exactly what the SDK's encoder gives."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from otelprof.recording import otlp_json


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        self.spans.extend(spans)  # type: ignore[arg-type]
        return SpanExportResult.SUCCESS


def _spans() -> list[ReadableSpan]:
    keep = _Keep()
    provider = TracerProvider(resource=Resource({"service.name": "t", "otelprof.rank": 3, "ok": True}))
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("otelprof", "1.0")
    root = tracer.start_span("otelprof.step", start_time=1_000, attributes={
        "otelprof.step.number": 7, "otelprof.scalar.loss": 0.25, "flag": False, "tags": ["a", "b"],
        "nan": float("nan")})
    root.add_event("operator", attributes={"otelprof.op.name": "aten::mm", "otelprof.op.calls": 3}, timestamp=1_500)
    child = tracer.start_span("forward", context=trace.set_span_in_context(root), start_time=1_100)
    child.set_status(trace.Status(trace.StatusCode.ERROR, "boom"))
    child.end(end_time=1_400)
    root.end(end_time=2_000)
    return keep.spans


def test_direct_span_encoding_matches_the_sdk_encoder() -> None:
    spans = _spans()
    direct = otlp_json.parse_traces(otlp_json.spans_to_json(spans))
    reference = otlp_json.parse_traces(otlp_json.spans_to_json_via_protobuf(spans))
    # NaN != NaN, so compare the encodings of the parsed messages
    assert direct.SerializeToString(deterministic=True) == reference.SerializeToString(deterministic=True)


def test_ids_are_hex_and_enums_are_integers() -> None:
    import json

    line = json.loads(otlp_json.spans_to_json(_spans()))
    span = line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and int(span["traceId"], 16)
    assert isinstance(span["kind"], int)
