"""The OpenTelemetry Resource of one training process, and the identity labels derived from it.

Detected values (job, run, rank, Kubernetes pod/namespace/node/container, host, and what the
process runs on: Python, PyTorch, OS, CPU, cloud instance type, GPUs) are overridden by
``OTEL_RESOURCE_ATTRIBUTES``, as the OpenTelemetry spec asks.
"""

from __future__ import annotations

import os
import socket

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from otelprof import semconv as sc
from otelprof._version import __version__
from otelprof.collectors import environment
from otelprof.config import Config


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
    from_env = OTELResourceDetector().detect()
    resource = Resource.create({}).merge(Resource(detected, sc.SCHEMA_URL)).merge(from_env)
    # OTELPROF_JOB_NAME is the most explicit job name there is.
    return resource.merge(Resource({sc.SERVICE_NAME: config.job_name}, sc.SCHEMA_URL))


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
