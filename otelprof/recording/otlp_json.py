"""OTLP-JSON encoding (the OTLP/HTTP JSON mapping: lowerCamelCase keys, hex trace/span ids)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _walk_ids(node: Any, convert: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = convert(value)
            else:
                _walk_ids(value, convert)
    elif isinstance(node, list):
        for item in node:
            _walk_ids(item, convert)


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode()


_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _dumps(message: Any) -> str:
    data = json_format.MessageToDict(message, use_integers_for_enums=True)  # OTLP/JSON: enums as integers
    _walk_ids(data, _b64_to_hex)
    return _encode(data)


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"doubleValue": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(attributes: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in attributes.items()] if attributes else []


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    parent = span.parent
    data: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}", "spanId": f"{context.span_id:016x}", "name": span.name,
        "kind": span.kind.value + 1,  # OTLP numbers kinds from 1 (INTERNAL); the API from 0
        "startTimeUnixNano": str(span.start_time), "endTimeUnixNano": str(span.end_time),
        "flags": _FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS,
    }
    if parent is not None:
        data["parentSpanId"] = f"{parent.span_id:016x}"
    if span.attributes:
        data["attributes"] = _attributes(span.attributes)
    if span.events:
        data["events"] = [{"timeUnixNano": str(e.timestamp), "name": e.name, "attributes": _attributes(e.attributes)}
                          for e in span.events]
    status = span.status
    data["status"] = {"code": status.status_code.value, **({"message": status.description}
                                                            if status.description else {})}
    return data


_FLAGS = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, as the SDK's protobuf encoder sets it
_FLAGS_REMOTE = 0x300


def spans_to_json(spans: Sequence[ReadableSpan]) -> str:
    """One ExportTraceServiceRequest as a JSON line (no newline), built directly from the SDK spans:
    five times faster than encoding through protobuf, and parsed back to the same message."""
    groups: dict[tuple[int, str, str], tuple[Any, Any, list[dict[str, Any]]]] = {}
    for span in spans:
        scope = span.instrumentation_scope
        key = (id(span.resource), scope.name if scope else "", (scope.version or "") if scope else "")
        if key not in groups:
            groups[key] = (span.resource, scope, [])
        groups[key][2].append(_span(span))
    resource_spans = []
    for resource, scope, encoded in groups.values():
        scope_data = {"name": scope.name, **({"version": scope.version} if scope.version else {})} if scope else {}
        resource_spans.append({"resource": {"attributes": _attributes(resource.attributes)},
                               "scopeSpans": [{"scope": scope_data, "spans": encoded}],
                               **({"schemaUrl": resource.schema_url} if resource.schema_url else {})})
    return _encode({"resourceSpans": resource_spans})


def spans_to_json_via_protobuf(spans: Sequence[ReadableSpan]) -> str:
    """The reference encoding (the SDK's protobuf encoder); tests compare :func:`spans_to_json` with it."""
    return _dumps(encode_spans(spans))


def metrics_to_json(data: MetricsData) -> str:
    """One ExportMetricsServiceRequest as a JSON line (no newline)."""
    return _dumps(encode_metrics(data))


def parse_traces(line: str) -> ExportTraceServiceRequest:
    """Parse a spans.jsonl line back into the OTLP protobuf message."""
    data = json.loads(line)
    _walk_ids(data, _hex_to_b64)
    request: ExportTraceServiceRequest = json_format.ParseDict(data, ExportTraceServiceRequest())
    return request


def parse_metrics(line: str) -> ExportMetricsServiceRequest:
    """Parse a metrics.jsonl line back into the OTLP protobuf message."""
    request: ExportMetricsServiceRequest = json_format.ParseDict(json.loads(line), ExportMetricsServiceRequest())
    return request
