"""OTLP-JSON encoding (the OTLP/HTTP JSON mapping: lowerCamelCase keys, hex trace/span ids)."""

from __future__ import annotations

import base64
import json
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


def _dumps(message: Any) -> str:
    data = json_format.MessageToDict(message)
    _walk_ids(data, _b64_to_hex)
    return json.dumps(data, separators=(",", ":"))


def spans_to_json(spans: Sequence[ReadableSpan]) -> str:
    """One ExportTraceServiceRequest as a JSON line (no newline)."""
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
