"""OTLP-JSON encoding (the OTLP/HTTP JSON mapping: lowerCamelCase keys, hex trace/span ids)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, StatusCode

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


_string = encode_basestring_ascii  # exactly what _encode writes for a str (ensure_ascii)


def _text(value: Any) -> str:
    """``_encode(value)``, short-cut for a str."""
    return _string(value) if isinstance(value, str) else _encode(value)


# Attribute keys and short str/bool attributes repeat from span to span: their encodings are cached (bounded).
_CACHE_SIZE = 4096
_CACHED_STRING_LEN = 64
_KEYS: dict[Any, str] = {}
_PAIRS: dict[tuple[Any, Any], str] = {}
_TRUE = '{"boolValue":true}'
_FALSE = '{"boolValue":false}'


def _value(value: Any) -> str:
    """The AnyValue of one attribute value."""
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, int):
        return f'{{"intValue":{_string(str(value))}}}'
    if isinstance(value, float):
        if math.isfinite(value):
            return f'{{"doubleValue":{float.__repr__(value)}}}'
        return '{"doubleValue":"NaN"}' if math.isnan(value) else (
            '{"doubleValue":"Infinity"}' if value > 0 else '{"doubleValue":"-Infinity"}')
    if isinstance(value, str):
        return f'{{"stringValue":{_string(value)}}}'
    if isinstance(value, (list, tuple)):
        return f'{{"arrayValue":{{"values":[{",".join([_value(v) for v in value])}]}}}}'
    return f'{{"stringValue":{_string(str(value))}}}'


def _key(key: Any) -> str:
    """The opening of one KeyValue, up to its value."""
    encoded = _KEYS.get(key)
    if encoded is None:
        encoded = f'{{"key":{_text(key)},"value":'
        if type(key) is str:  # 1 == 1.0 == True: cache str keys only
            if len(_KEYS) >= _CACHE_SIZE:
                _KEYS.clear()
            _KEYS[key] = encoded
    return encoded


def _attributes(attributes: Any) -> str:
    """The KeyValues (without brackets) of a span's, an event's or a resource's attributes."""
    if attributes is None:
        return ""
    try:
        items = attributes.copy().items()  # a BoundedAttributes iterates through __getitem__: copy its dict
    except AttributeError:
        items = attributes.items()
    parts = []
    for key, value in items:
        kind = type(value)
        if kind is str or kind is bool:  # a str never equals a bool, so one cache serves both
            pair = _PAIRS.get((key, value))
            if pair is None:
                pair = f"{_key(key)}{_value(value)}}}"
                if type(key) is str and (kind is bool or len(value) <= _CACHED_STRING_LEN):
                    if len(_PAIRS) >= _CACHE_SIZE:
                        _PAIRS.clear()
                    _PAIRS[(key, value)] = pair
            parts.append(pair)
        elif kind is int:
            parts.append(f'{_key(key)}{{"intValue":"{value}"}}}}')
        else:
            parts.append(f"{_key(key)}{_value(value)}}}")
    return ",".join(parts)


def _event(event: Event) -> str:
    return (f'{{"timeUnixNano":"{event.timestamp}","name":{_text(event.name)},'
            f'"attributes":[{_attributes(event.attributes)}]}}')


_FLAGS = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, as the SDK's protobuf encoder sets it
_FLAGS_REMOTE = 0x300
_NO_PARENT = f',"flags":{_FLAGS}'
_INTERNAL = SpanKind.INTERNAL
_UNSET_CODE = StatusCode.UNSET


def _fields(span: ReadableSpan) -> tuple[Any, ...]:
    """resource, scope, name, context, parent, kind, start and end time, attributes, events, status."""
    if type(span) is ReadableSpan:
        # What the SDK hands its span processors: read its fields, not its properties, which copy the
        # attributes into a proxy and the events (under a lock) into a tuple.
        try:
            return (span._resource, span._instrumentation_scope, span._name, span._context, span._parent,
                    span._kind, span._start_time, span._end_time, span._attributes, span._events, span._status)
        except AttributeError:  # another SDK version
            pass
    return (span.resource, span.instrumentation_scope, span.name, span.get_span_context(), span.parent,
            span.kind, span.start_time, span.end_time, span.attributes, span.events, span.status)


def _span(fields: tuple[Any, ...], trace_ids: dict[int, str], span_ids: dict[int, str]) -> str:
    """One Span (its keys in the order the dict-based encoder wrote them), from its :func:`_fields`;
    trace_ids and span_ids cache hex ids within a batch (a step's spans share a trace and parents)."""
    _, _, name, context, parent, kind, start, end, attributes, events, status = fields
    assert context is not None
    trace_id = context.trace_id
    trace_hex = trace_ids.get(trace_id)
    if trace_hex is None:
        trace_hex = trace_ids[trace_id] = f"{trace_id:032x}"
    span_id = context.span_id
    span_hex = span_ids.get(span_id)
    if span_hex is None:
        span_hex = span_ids[span_id] = f"{span_id:016x}"
    if parent is None:
        rest = _NO_PARENT
    else:
        parent_id = parent.span_id
        parent_hex = span_ids.get(parent_id)
        if parent_hex is None:
            parent_hex = span_ids[parent_id] = f"{parent_id:016x}"
        rest = f',"flags":{_FLAGS_REMOTE if parent.is_remote else _FLAGS},"parentSpanId":"{parent_hex}"'
    encoded = _attributes(attributes)
    if encoded:
        rest = f'{rest},"attributes":[{encoded}]'
    if events:
        rest = f'{rest},"events":[{",".join([_event(e) for e in events])}]'
    code = status.status_code
    description = status.description
    if description:
        rest = f'{rest},"status":{{"code":{code.value},"message":{_text(description)}}}'
    elif code is _UNSET_CODE:
        rest = f'{rest},"status":{{"code":0}}'
    else:
        rest = f'{rest},"status":{{"code":{code.value}}}'
    name = _string(name) if type(name) is str else _encode(name)
    # OTLP numbers kinds from 1 (INTERNAL); the API from 0
    return (f'{{"traceId":"{trace_hex}","spanId":"{span_hex}","name":{name},'
            f'"kind":{1 if kind is _INTERNAL else kind.value + 1},"startTimeUnixNano":"{start}",'
            f'"endTimeUnixNano":"{end}"{rest}}}')


# A ResourceSpans' encoding before and after its spans, by the identity of its resource and scope (both
# immutable). Each entry holds the two, so that their ids are not reused while cached.
_GROUPS: dict[tuple[int, int], tuple[Resource, InstrumentationScope | None, str, str]] = {}
_GROUPS_SIZE = 16


def _group(resource: Resource, scope: InstrumentationScope | None) -> tuple[str, str]:
    """The encoding of a ResourceSpans before and after its spans."""
    cached = _GROUPS.get((id(resource), id(scope)))
    if cached is not None and cached[0] is resource and cached[1] is scope:
        return cached[2], cached[3]
    if not scope:
        scope_json = "{}"
    elif scope.version:
        scope_json = f'{{"name":{_text(scope.name)},"version":{_text(scope.version)}}}'
    else:
        scope_json = f'{{"name":{_text(scope.name)}}}'
    head = (f'{{"resource":{{"attributes":[{_attributes(resource.attributes)}]}},'
            f'"scopeSpans":[{{"scope":{scope_json},"spans":[')
    tail = f']}}],"schemaUrl":{_text(resource.schema_url)}}}' if resource.schema_url else "]}]}"
    if len(_GROUPS) >= _GROUPS_SIZE:
        _GROUPS.clear()
    _GROUPS[(id(resource), id(scope))] = (resource, scope, head, tail)
    return head, tail


_UNSET = object()


def spans_to_json(spans: Sequence[ReadableSpan]) -> str:
    """One ExportTraceServiceRequest as a JSON line (no newline), formatted directly from the SDK spans:
    many times faster than encoding through protobuf, and parsed back to the same message."""
    groups: dict[tuple[int, str, str], tuple[Resource, InstrumentationScope | None, list[str]]] = {}
    last_resource: Any = _UNSET
    last_scope: Any = _UNSET
    encoded: list[str] = []
    trace_ids: dict[int, str] = {}
    span_ids: dict[int, str] = {}
    for span in spans:
        fields = _fields(span)
        resource, scope = fields[0], fields[1]
        if resource is not last_resource or scope is not last_scope:  # spans of one tracer share both objects
            key = (id(resource), scope.name if scope else "", (scope.version or "") if scope else "")
            group = groups.get(key)
            if group is None:
                group = groups[key] = (resource, scope, [])
            encoded = group[2]
            last_resource, last_scope = resource, scope
        encoded.append(_span(fields, trace_ids, span_ids))
    resource_spans = []
    for resource, scope, group_spans in groups.values():
        head, tail = _group(resource, scope)
        resource_spans.append(f'{head}{",".join(group_spans)}{tail}')
    return f'{{"resourceSpans":[{",".join(resource_spans)}]}}'


def spans_to_json_via_protobuf(spans: Sequence[ReadableSpan]) -> str:
    """The reference encoding (the SDK's protobuf encoder); tests compare :func:`spans_to_json` with it."""
    return _dumps(encode_spans(spans))


def metrics_to_json(data: MetricsData) -> str:
    """One ExportMetricsServiceRequest as a JSON line (no newline), without exemplars: the recording holds the
    traced steps' spans themselves."""
    message = encode_metrics(data)
    for resource in message.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.HasField("histogram"):
                    for point in metric.histogram.data_points:
                        if point.exemplars:
                            point.ClearField("exemplars")
    return _dumps(message)


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
