"""The recording-rule groups of the rules file: the catalog's records (:mod:`~otelprof.mixin.rules`), the
dashboards' aggregates built on them (:mod:`~otelprof.mixin.recording_rules`) and, with DCGM as the GPU source,
its mapping rules first. Its own module so that the aggregates can read the records' names without a circle.

Every group also records :data:`EVALUATED`, a constant 1 labelled with the group's name: it exists exactly while
the group is evaluated, so OtelprofRecordingRulesMissing can tell a group that is not loaded from one whose
inputs are absent (a stalled job, a node without GPUs)."""

from __future__ import annotations

from typing import Any

from otelprof.mixin import gpu_source
from otelprof.mixin import recording_rules as recording_rules_aggregation
from otelprof.mixin.config import GPU_SOURCE_DCGM, MixinConfig
from otelprof.mixin.rules import recording_rules

EVALUATED = "otelprof:rule_group:evaluated"
"""Recorded by every group at every evaluation: ``1``, labelled ``rule_group`` with the group's name."""
GROUP_LABEL = "rule_group"


def evaluated(group: str) -> dict[str, Any]:
    """The constant rule of ``group``: it needs no input, so it records whenever the group is evaluated."""
    return {"record": EVALUATED, "expr": "vector(1)", "labels": {GROUP_LABEL: group}}


def rule_groups(c: MixinConfig) -> list[dict[str, Any]]:
    records = recording_rules(c)
    interval = {"interval": c.recording_interval} if c.recording_interval else {}
    groups: list[dict[str, Any]] = [{"name": name, **interval, "rules": [r.rule() for r in records if r.group == name]}
                                    for name in dict.fromkeys(r.group for r in records)]
    groups.append(recording_rules_aggregation.group(c))
    if c.gpu_source == GPU_SOURCE_DCGM:
        groups.insert(0, {"name": gpu_source.GROUP, "rules": gpu_source.dcgm_rules(c)})
    return [{**group, "rules": [*group["rules"], evaluated(group["name"])]} for group in groups]
