"""The OpenTelemetry Resource of one training process, and the identity labels derived from it.

Detected values (job, run, rank, Kubernetes pod/namespace/node/container, host, and what the
process runs on: Python, PyTorch, OS, CPU, cloud instance type, GPUs) are overridden by
``OTEL_RESOURCE_ATTRIBUTES``, as the OpenTelemetry spec asks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Mapping
from typing import Any
from urllib import parse

from opentelemetry.sdk.resources import Resource

from otelprof import environment_variables as ev
from otelprof import semconv as sc
from otelprof._arguments import encodable
from otelprof._log import escape, warn_once
from otelprof._version import __version__
from otelprof.config import Config
from otelprof.runtime.collectors import environment


def build_resource(config: Config, extra: dict[str, str | int] | None = None) -> Resource:
    """The process's resource; ``extra`` adds detected attributes (the GPUs, known once NVML is open)."""
    detected: dict[str, str | int] = {
        sc.SERVICE_NAME: config.job_name,
        sc.SERVICE_INSTANCE_ID: f"{config.run_id}-rank{config.rank}",
        sc.HOST_NAME: socket.gethostname(),
        sc.PROCESS_PID: os.getpid(),
        sc.OTELPROF_RUN_ID: config.run_id,
        sc.OTELPROF_RANK: config.rank,
        sc.OTELPROF_LOCAL_RANK: config.local_rank,
        sc.OTELPROF_WORLD_SIZE: config.world_size,
        sc.OTELPROF_VERSION: __version__,
    }
    detected.update(environment.software_attributes())
    detected.update(environment.machine_attributes(os.environ))
    detected.update(extra or {})
    for key, value in (
        (sc.K8S_POD_NAME, config.pod_name),
        (sc.K8S_NAMESPACE_NAME, config.pod_namespace),
        (sc.K8S_NODE_NAME, config.node_name),
        (sc.K8S_CONTAINER_NAME, config.container_name),
        (sc.K8S_POD_UID, config.pod_uid),
        (sc.K8S_JOB_NAME, config.k8s_job_name),
        (sc.SERVICE_NAMESPACE, config.pod_namespace),  # service.namespace + service.name: the job, uniquely
    ):
        if value:
            detected[key] = value
    with _sdk_quiet():  # Resource.create runs the SDK's own OTEL_RESOURCE_ATTRIBUTES detector
        resource = Resource.create({}).merge(Resource(detected, sc.SCHEMA_URL)).merge(
            Resource(environment_attributes(os.environ)))
    # OTELPROF_JOB_NAME is the most explicit job name there is.
    resource = resource.merge(Resource({sc.SERVICE_NAME: config.job_name}, sc.SCHEMA_URL))
    return Resource({key: _encodable(value) for key, value in resource.attributes.items()}, resource.schema_url)


def environment_attributes(env: Mapping[str, str]) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` (``key=value`` pairs, values percent-encoded, separated by commas) and
    ``OTEL_SERVICE_NAME``, as the SDK reads them; empty entries (``a=b,``) are skipped, an entry that is not
    ``key=value`` is named once in a warning and skipped."""
    attributes: dict[str, str] = {}
    for item in env.get(ev.OTEL_RESOURCE_ATTRIBUTES, "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            warn_once("resource:attributes", "otelprof: %s has an entry that is not key=value (%s); it is ignored",
                      ev.OTEL_RESOURCE_ATTRIBUTES, escape(item, 80))
            continue
        attributes[encodable(key.strip())] = encodable(parse.unquote(value.strip()))
    service_name = env.get(ev.OTEL_SERVICE_NAME)
    if service_name:
        attributes[sc.SERVICE_NAME] = encodable(service_name)
    return attributes


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, tuple) and any(isinstance(item, str) for item in value):
        return tuple(encodable(item) if isinstance(item, str) else item for item in value)
    return value


class _DropEnvWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Invalid key value resource attribute pair")


@contextlib.contextmanager
def _sdk_quiet() -> Iterator[None]:
    """The SDK's unprefixed warnings about ``OTEL_RESOURCE_ATTRIBUTES`` left out: :func:`environment_attributes`
    says it once, as otelprof."""
    sdk_logger = logging.getLogger("opentelemetry.sdk.resources")
    quiet = _DropEnvWarnings()
    sdk_logger.addFilter(quiet)
    try:
        yield
    finally:
        sdk_logger.removeFilter(quiet)


def identity_labels(resource: Resource) -> dict[str, str]:
    """The labels on every otelprof series: job_name, rank, local_rank, node."""
    attrs = resource.attributes
    node = attrs.get(sc.K8S_NODE_NAME) or attrs.get(sc.HOST_NAME) or ""
    return {
        sc.LABEL_JOB: str(attrs.get(sc.SERVICE_NAME, "")),
        sc.LABEL_RANK: str(attrs.get(sc.OTELPROF_RANK, 0)),
        sc.LABEL_LOCAL_RANK: str(attrs.get(sc.OTELPROF_LOCAL_RANK, 0)),
        sc.LABEL_NODE: str(node),
    }
