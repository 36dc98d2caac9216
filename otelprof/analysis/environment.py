"""The environment the job ran in: instance type, GPUs and their driver, CUDA, PyTorch, Python, OS.

Each rank's process recorded what it runs on as resource attributes at ``init()``
(:mod:`otelprof.runtime.collectors.environment`): the recording's manifests hold them, Prometheus has them
on ``target_info``. A field with one value on every rank is one row; a field whose value differs
between ranks or nodes (a mixed driver, one node on another instance type) gets a row per value,
saying where. Fields no rank recorded are listed as missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from otelprof import semconv as sc
from otelprof.analysis.run import RunView

SCOPE_NODE = "node"
SCOPE_RANK = "rank"
MAX_VALUES = 8
"""Rows per field at most (a field that differs everywhere is cut here and says how many values it had)."""

LOGICAL_CPUS = "logical_cpus"
GPUS_SAMPLED = "gpus_sampled"
"""Fields counted from the node samples rather than recorded as attributes."""

FIELDS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (sc.HOST_TYPE, "Instance type", (sc.HOST_TYPE,), SCOPE_NODE),
    (sc.CLOUD_PROVIDER, "Cloud", (sc.CLOUD_PROVIDER,), SCOPE_NODE),
    (sc.OTELPROF_GPU_MODEL, "GPU model", (sc.OTELPROF_GPU_MODEL,), SCOPE_NODE),
    (GPUS_SAMPLED, "GPUs sampled on the node", (), SCOPE_NODE),
    (sc.OTELPROF_GPU_COUNT, "GPUs visible to the process", (sc.OTELPROF_GPU_COUNT,), SCOPE_RANK),
    (sc.OTELPROF_GPU_DRIVER, "NVIDIA driver", (sc.OTELPROF_GPU_DRIVER,), SCOPE_NODE),
    (sc.OTELPROF_CUDA_DRIVER, "CUDA supported by the driver", (sc.OTELPROF_CUDA_DRIVER,), SCOPE_NODE),
    (sc.OTELPROF_TORCH_VERSION, "PyTorch", (sc.OTELPROF_TORCH_VERSION,), SCOPE_RANK),
    (sc.OTELPROF_TORCH_CUDA, "CUDA PyTorch was built with", (sc.OTELPROF_TORCH_CUDA,), SCOPE_RANK),
    (sc.PROCESS_RUNTIME_VERSION, "Python", (sc.PROCESS_RUNTIME_NAME, sc.PROCESS_RUNTIME_VERSION), SCOPE_RANK),
    (sc.HOST_CPU_MODEL, "CPU", (sc.HOST_CPU_MODEL,), SCOPE_NODE),
    (LOGICAL_CPUS, "Logical CPUs", (), SCOPE_NODE),
    (sc.HOST_ARCH, "Architecture", (sc.HOST_ARCH,), SCOPE_NODE),
    (sc.OS_TYPE, "Operating system", (sc.OS_TYPE, sc.OS_VERSION), SCOPE_NODE),
    (sc.OTELPROF_VERSION, "otelprof", (sc.OTELPROF_VERSION,), SCOPE_RANK),
)
"""(field id, label, resource attributes joined into its value, scope)."""


@dataclass(frozen=True)
class EnvironmentRow:
    field: str
    """A resource attribute name, or LOGICAL_CPUS / GPUS_SAMPLED."""
    label: str
    value: str
    """"" where the ranks listed did not record it (while others did)."""
    scope: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    everywhere: bool
    """Every rank (node) of the job has this value."""


@dataclass(frozen=True)
class Environment:
    rows: tuple[EnvironmentRow, ...]
    missing: tuple[tuple[str, str], ...]
    """(field id, label) of the fields no rank recorded."""
    more_values: tuple[tuple[str, int], ...] = ()
    """(field id, values left out) of fields with more than MAX_VALUES values."""


@dataclass(frozen=True)
class Subject:
    """One rank: its node and resource attributes."""

    rank: int
    node: str
    attributes: Mapping[str, Any]


def environment(subjects: Iterable[Subject], node_facts: Mapping[str, Mapping[str, str]] | None = None
                ) -> Environment:
    """The environment table from each rank's resource attributes and, per node, facts counted from its
    samples (``{node: {LOGICAL_CPUS: "8", GPUS_SAMPLED: "4"}}``)."""
    people = sorted(subjects, key=lambda s: (s.rank, s.node))
    facts = node_facts or {}
    all_nodes = tuple(sorted({s.node for s in people} | set(facts)))
    rows: list[EnvironmentRow] = []
    missing: list[tuple[str, str]] = []
    more: list[tuple[str, int]] = []
    for field, label, keys, scope in FIELDS:
        groups: dict[str, tuple[set[int], set[str]]] = {}
        if keys:
            for s in people:
                value = " ".join(str(s.attributes[k]) for k in keys if str(s.attributes.get(k, "") or ""))
                ranks, nodes = groups.setdefault(value, (set(), set()))
                ranks.add(s.rank)
                nodes.add(s.node)
        else:
            for node in all_nodes:
                value = str(facts.get(node, {}).get(field, ""))
                groups.setdefault(value, (set(), set()))[1].add(node)
        if not any(groups):
            missing.append((field, label))
            continue
        ordered = sorted(groups.items(), key=lambda kv: (kv[0] == "", -len(kv[1][1 if scope == SCOPE_NODE else 0]),
                                                         kv[0]))
        if len(ordered) > MAX_VALUES:
            more.append((field, len(ordered) - MAX_VALUES))
        for value, (ranks, nodes) in ordered[:MAX_VALUES]:
            rows.append(EnvironmentRow(field, label, value, scope, tuple(sorted(ranks)), tuple(sorted(nodes)),
                                       len(ordered) == 1))
    return Environment(tuple(rows), tuple(missing), tuple(more))


def recording_environment(view: RunView) -> Environment:
    """From the manifests' resources and the node samples."""
    subjects = [Subject(info.rank, info.node, rank.manifest.get("resource") or {})
                for rank, info in zip(view.ranks, view.info)]
    facts: dict[str, dict[str, str]] = {}
    for node, (_, columns) in view.nodes().items():
        found = facts.setdefault(node, {})
        if columns.cores:
            found[LOGICAL_CPUS] = str(columns.cores)
        found[GPUS_SAMPLED] = str(len(columns.gpus))
    return environment(subjects, facts)
