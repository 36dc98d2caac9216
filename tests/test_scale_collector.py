"""The two-tier Collector configs (deploy/scale/otel-collector-*.yaml) against the components' config structure.

No Collector binary runs here. The checks are what can be checked without one: each component's settings
against the fields its ``config.go`` declares (``mapstructure`` tags of opentelemetry-collector-contrib's
loadbalancingexporter and tailsamplingprocessor, the core otlp receiver/exporter, memory_limiter and batch),
as JSON Schemas that refuse unknown fields; the service graph (every pipeline component defined, every
defined component used, memory_limiter first); and every attribute the sampling policies read, with its
values, in otelprof's catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from otelprof import semconv as sc
from otelprof.semconv_attributes import ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "deploy/scale/otel-collector-agent.yaml"
GATEWAY = ROOT / "deploy/scale/otel-collector-gateway.yaml"


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


STR = {"type": "string"}
INT = {"type": "integer", "minimum": 0}
BOOL = {"type": "boolean"}
DURATION = {"type": "string", "pattern": r"^\d+(ms|s|m|h)$"}
TLS = _obj({"insecure": BOOL, "insecure_skip_verify": BOOL, "ca_file": STR, "cert_file": STR, "key_file": STR,
            "server_name_override": STR})
QUEUE = _obj({"enabled": BOOL, "num_consumers": INT, "queue_size": INT})
RETRY = _obj({"enabled": BOOL, "initial_interval": DURATION, "max_interval": DURATION, "max_elapsed_time": DURATION})
OTLP_CLIENT = {"endpoint": STR, "tls": TLS, "timeout": DURATION, "sending_queue": QUEUE, "retry_on_failure": RETRY,
               "compression": STR, "headers": {"type": "object"}}
SERVER = _obj({"endpoint": STR})

COMPONENTS: dict[str, dict[str, Any]] = {
    "receivers/otlp": _obj({"protocols": _obj({"grpc": SERVER, "http": SERVER})}, ("protocols",)),
    "processors/memory_limiter": _obj({"check_interval": DURATION, "limit_mib": INT, "spike_limit_mib": INT,
                                       "limit_percentage": INT, "spike_limit_percentage": INT},
                                      ("check_interval",)),
    "processors/batch": _obj({"send_batch_size": INT, "send_batch_max_size": INT, "timeout": DURATION}),
    "exporters/otlp": _obj(OTLP_CLIENT, ("endpoint",)),
    # loadbalancingexporter/config.go: routing_key, protocol.otlp (the otlp exporter's settings, endpoint
    # left to the resolver), resolver with exactly one of static / dns / k8s / aws_cloud_map.
    "exporters/loadbalancing": _obj({
        "routing_key": {"enum": ["traceID", "service", "resource", "metric", "streamID", "attributes"]},
        "protocol": _obj({"otlp": _obj({k: v for k, v in OTLP_CLIENT.items() if k != "endpoint"})}, ("otlp",)),
        "resolver": {**_obj({
            "static": _obj({"hostnames": {"type": "array", "items": STR, "minItems": 1}}, ("hostnames",)),
            "dns": _obj({"hostname": STR, "port": STR, "interval": DURATION, "timeout": DURATION}, ("hostname",)),
            "k8s": _obj({"service": STR, "ports": {"type": "array", "items": INT}, "timeout": DURATION,
                         "return_hostnames": BOOL}, ("service",)),
        }), "minProperties": 1, "maxProperties": 1},
    }, ("protocol", "resolver")),
    # tailsamplingprocessor/config.go: decision_wait, num_traces, expected_new_traces_per_sec, policies; a
    # policy's `type` names the key holding its settings.
    "processors/tail_sampling": _obj({
        "decision_wait": DURATION, "num_traces": INT, "expected_new_traces_per_sec": INT,
        "decision_cache": _obj({"sampled_cache_size": INT, "non_sampled_cache_size": INT}),
        "policies": {"type": "array", "minItems": 1, "items": {"oneOf": [
            _obj({"name": STR, "type": {"const": "boolean_attribute"},
                  "boolean_attribute": _obj({"key": STR, "value": BOOL, "invert_match": BOOL}, ("key", "value"))},
                 ("name", "type", "boolean_attribute")),
            _obj({"name": STR, "type": {"const": "string_attribute"},
                  "string_attribute": _obj({"key": STR, "values": {"type": "array", "items": STR, "minItems": 1},
                                            "enabled_regex_matching": BOOL, "cache_max_size": INT,
                                            "invert_match": BOOL}, ("key", "values"))},
                 ("name", "type", "string_attribute")),
            _obj({"name": STR, "type": {"const": "probabilistic"},
                  "probabilistic": _obj({"sampling_percentage": {"type": "number", "exclusiveMinimum": 0,
                                                                 "maximum": 100}, "hash_salt": STR},
                                        ("sampling_percentage",))},
                 ("name", "type", "probabilistic")),
        ]}},
    }, ("policies",)),
    "extensions/health_check": _obj({"endpoint": STR}),
}


def _load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def _components(config: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(kind, name as configured, settings) of every component; ``otlp/tempo`` is of type ``otlp``."""
    return [(kind, name, settings) for kind in ("receivers", "processors", "exporters", "extensions")
            for name, settings in (config.get(kind) or {}).items()]


@pytest.mark.parametrize("path", [AGENT, GATEWAY], ids=["agent", "gateway"])
def test_every_component_matches_its_config_structure(path: Path) -> None:
    config = _load(path)
    assert set(config) <= {"receivers", "processors", "exporters", "extensions", "connectors", "service"}
    for kind, name, settings in _components(config):
        schema = COMPONENTS.get(f"{kind}/{name.split('/')[0]}")
        assert schema is not None, f"{path.name}: no schema for {kind}/{name}: add its fields from its config.go"
        jsonschema.validate(settings or {}, schema)


@pytest.mark.parametrize("path", [AGENT, GATEWAY], ids=["agent", "gateway"])
def test_the_service_graph_is_whole(path: Path) -> None:
    config = _load(path)
    service = config["service"]
    used: set[tuple[str, str]] = {("extensions", e) for e in service.get("extensions", [])}
    for name, pipeline in service["pipelines"].items():
        assert name.split("/")[0] in ("traces", "metrics", "logs")
        assert pipeline["receivers"] and pipeline["exporters"]
        assert pipeline["processors"][0] == "memory_limiter"  # refuse data before the collector's memory runs out
        for kind in ("receivers", "processors", "exporters"):
            used |= {(kind, component) for component in pipeline.get(kind, [])}
    defined = {(kind, name) for kind, name, _ in _components(config)}
    assert used == defined, f"used but undefined: {used - defined}; defined but unused: {defined - used}"


def test_the_agent_routes_whole_traces_to_the_gateways() -> None:
    config = _load(AGENT)
    exporter = config["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "traceID"
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["loadbalancing"]
    assert "tail_sampling" not in config.get("processors", {})  # decisions need whole traces: the gateway's
    port = exporter["resolver"]["dns"]["port"]
    assert f":{port}" in str(_load(GATEWAY)["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])


def test_sampling_policies_read_catalog_attributes_and_values() -> None:
    config = _load(GATEWAY)
    policies = config["processors"]["tail_sampling"]["policies"]
    assert config["service"]["pipelines"]["traces"]["processors"] == ["memory_limiter", "tail_sampling", "batch"]
    catalog = {a.name: a for a in ATTRIBUTES}
    values = {sc.ATTR_SPAN_REASON: set(sc.SPAN_REASONS), sc.ATTR_PROFILE_TRIGGER: set(sc.PROFILE_TRIGGERS)}
    keys = set()
    for policy in policies:
        settings = policy.get(policy["type"], {})
        if "key" not in settings:
            continue
        key = settings["key"]
        keys.add(key)
        assert key in catalog and catalog[key].where.startswith("span"), f"{policy['name']}: {key} not a span " \
                                                                          "attribute of the catalog"
        if policy["type"] == "string_attribute":
            assert set(settings["values"]) <= values[key], f"{policy['name']}: values outside the catalog's"
    # what the gateway promises: outliers, profiling windows (their steps and summaries), a share of the rest
    assert keys == {sc.ATTR_STEP_OUTLIER, sc.ATTR_SPAN_REASON, sc.ATTR_PROFILE_TRIGGER}
    kept = {v for p in policies if p["type"] == "string_attribute" for v in p["string_attribute"]["values"]}
    assert {"outlier", "window"} <= kept and set(sc.PROFILE_TRIGGERS) <= kept
    share = [p["probabilistic"]["sampling_percentage"] for p in policies if p["type"] == "probabilistic"]
    assert share and 0 < share[0] < 100
    assert len({p["name"] for p in policies}) == len(policies)


def test_a_misspelt_field_or_a_foreign_attribute_is_caught() -> None:
    config = _load(GATEWAY)
    broken = dict(config["processors"]["tail_sampling"])
    broken["decison_wait"] = broken.pop("decision_wait")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, COMPONENTS["processors/tail_sampling"])
    two = {"static": {"hostnames": ["a:4317"]}, "dns": {"hostname": "b"}}
    agent = {**_load(AGENT)["exporters"]["loadbalancing"], "resolver": two}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(agent, COMPONENTS["exporters/loadbalancing"])
    assert "otelprof.step.slow" not in {a.name for a in ATTRIBUTES}
