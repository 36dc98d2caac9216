"""The recording's OTLP-JSON: the direct span encoder parses back to exactly what the SDK's encoder gives."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

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


_AWKWARD = 'quote " backslash \\ newline \n tab \t nul \x00 unicode é ☃ 😀 </script>'


class _Span(ReadableSpan):
    """Not exactly a ReadableSpan: the encoder reads it through the public properties."""


def _awkward_spans() -> list[ReadableSpan]:
    scope = InstrumentationScope("scope \"q\"", "1.0")
    first = Resource({"service.name": _AWKWARD, "n": -3, "x": 1.5, "tags": ("a", "b")}, "https://schema/1.0")
    second = Resource({"service.name": "other"})
    root_context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0x00F067AA0BA902B7, False,
                               TraceFlags(TraceFlags.SAMPLED))
    attributes = {
        _AWKWARD: _AWKWARD, "negative": -42, "zero": 0, "big": 2**63 - 1, "nan": float("nan"),
        "inf": float("inf"), "-inf": float("-inf"), "double": -0.1, "flag": True, "off": False,
        "list": ["a", _AWKWARD], "ints": [1, -2], "floats": (0.5, float("nan")), "bools": [True, False], "empty": "",
    }
    root = ReadableSpan(
        _AWKWARD, root_context, None, first, attributes,
        events=[Event("event \"e\"", {"k": _AWKWARD, "n": -1, "f": float("-inf")}, timestamp=1_050),
                Event("bare", None, timestamp=1_060)],
        kind=SpanKind.SERVER, status=Status(StatusCode.ERROR, _AWKWARD), start_time=1_000, end_time=2_000,
        instrumentation_scope=scope)
    child_context = SpanContext(root_context.trace_id, 0x1111111111111111, False)
    child = ReadableSpan("child", child_context, root_context, first, None, kind=SpanKind.CLIENT,
                         status=Status(StatusCode.OK), start_time=1_100, end_time=1_200, instrumentation_scope=scope)
    remote_parent = SpanContext(0xFF, 0xABCDEF, True)
    remote = _Span("remote child", SpanContext(0xFF, 0x2, False), remote_parent, second, {"only": "one"},
                   start_time=3, end_time=4, instrumentation_scope=InstrumentationScope("no version"))
    again = ReadableSpan("first resource again", SpanContext(0x1, 0x3, False), None, first, {},
                         start_time=5, end_time=6, instrumentation_scope=scope)
    return [root, child, remote, again, *_spans()]


def test_awkward_inputs_match_the_sdk_encoder() -> None:
    import json

    spans = _awkward_spans()
    line = otlp_json.spans_to_json(spans)
    assert "\n" not in line and line.isascii()
    json.loads(line)  # plain JSON, no NaN literals
    for _ in range(2):  # the second time through the caches
        direct = otlp_json.parse_traces(otlp_json.spans_to_json(spans))
        reference = otlp_json.parse_traces(otlp_json.spans_to_json_via_protobuf(spans))
        assert direct.SerializeToString(deterministic=True) == reference.SerializeToString(deterministic=True)
    resource_spans = json.loads(line)["resourceSpans"]
    assert len(resource_spans) == 3  # first, second, and the provider's resource
    root = resource_spans[0]["scopeSpans"][0]["spans"][0]
    assert root["name"] == _AWKWARD and "parentSpanId" not in root and root["flags"] == 0x100
    assert root["status"] == {"code": 2, "message": _AWKWARD}
    values = {a["key"]: a["value"] for a in root["attributes"]}
    assert values[_AWKWARD] == {"stringValue": _AWKWARD}
    assert values["negative"] == {"intValue": "-42"} and values["flag"] == {"boolValue": True}
    assert values["nan"] == {"doubleValue": "NaN"} and values["-inf"] == {"doubleValue": "-Infinity"}
    remote = resource_spans[1]["scopeSpans"][0]["spans"][0]
    assert remote["flags"] == 0x300 and remote["parentSpanId"] == "0000000000abcdef"
    assert "attributes" not in resource_spans[0]["scopeSpans"][0]["spans"][1]
