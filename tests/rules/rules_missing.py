"""promtool cases of OtelprofRecordingRulesMissing (otelprof/mixin/telemetry_alerts.py).

It fires, per job and recording group, when the alerts file is loaded without the rules file (a file of its
own, ``rules_missing_test.yaml``, loads only the alerts) or a group stops being evaluated, and names that group;
with both files loaded (``telemetry_test.yaml``) it stays quiet on a healthy job, a stalled one, a job without
GPU or sampler series, and a job in its first minutes.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.mixin.promql import series_name
from otelprof.mixin.rule_groups import EVALUATED, GROUP_LABEL, rule_groups
from tests.rules.cases import CONFIG, ID, TRAIN, Group, const, seq

GROUPS = [g["name"] for g in rule_groups(CONFIG)]
N = 40
"""1-minute intervals."""


def _job(g: Group, steps: int = N) -> Group:
    """A scraped training process whose steps (0.25 s each, 240 a minute) stop after ``steps`` minutes."""
    def run(per_minute: float) -> str:
        return seq([(steps, per_minute), *([(N - steps, 0)] if steps < N else [])])

    g.started(ID, N).counter(sc.STEPS, {**ID, **TRAIN}, run(240))
    g.add(series_name(sc.STEP_DURATION, "sum"), {**ID, **TRAIN}, run(60))
    return g.add(series_name(sc.STEP_DURATION, "count"), {**ID, **TRAIN}, run(240))


def _missing(group: str) -> dict[str, str]:
    return {"job_name": ID["job_name"], GROUP_LABEL: group}


def alerts_only_groups() -> list[Group]:
    """Only the alerts file is loaded: the recording groups' constants are absent or given as input."""
    groups = []
    g = Group("alerts loaded without the rules file", interval="1m")
    _job(g).silent("RecordingRulesMissing", "14m")
    groups.append(g.fires("RecordingRulesMissing", "15m", *((_missing(name), 1) for name in GROUPS)))

    g = Group("one recording group not evaluated: the alert names it", interval="1m")
    for name in GROUPS[:-1]:
        g.add(EVALUATED, {GROUP_LABEL: name}, const(1, N))
    _job(g).silent("RecordingRulesMissing", "14m")
    groups.append(g.fires("RecordingRulesMissing", "15m", (_missing(GROUPS[-1]), 1)))

    g = Group("a recording group evaluated for 10 min, then unloaded", interval="1m")
    for name in GROUPS:
        g.add(EVALUATED, {GROUP_LABEL: name}, f"{const(1, 10)} stale")
    # its last evaluation lingers 5 min (the lookback), then 15 min `for`
    _job(g).silent("RecordingRulesMissing", "29m")
    groups.append(g.fires("RecordingRulesMissing", "32m", *((_missing(name), 1) for name in GROUPS)))

    g = Group("recording groups evaluated every 4 min (longer than the lookback of an instant query)",
              interval="1m")
    for name in GROUPS:
        g.add(EVALUATED, {GROUP_LABEL: name}, " ".join("1" if i % 4 == 0 else "_" for i in range(N + 1)))
    groups.append(_job(g).silent("RecordingRulesMissing", "20m").silent("RecordingRulesMissing", "39m"))

    g = Group("no otelprof process scraped: nothing to judge", interval="1m")
    groups.append(g.add("up", {"job": "otelprof", "instance": ID["instance"]}, const(1, N))
                  .silent("RecordingRulesMissing", "30m"))
    return groups


def loaded_groups() -> list[Group]:
    """Both files loaded (telemetry_test.yaml): quiet on healthy and unusual jobs."""
    return [
        _job(Group("rules loaded: a healthy job", interval="1m")).silent("RecordingRulesMissing", "30m"),
        _job(Group("rules loaded: a job stalled after 5 min (no steps, no compute time recorded)", interval="1m"),
             steps=5).silent("RecordingRulesMissing", "20m").silent("RecordingRulesMissing", "39m"),
        Group("rules loaded: a job in its first minutes, no GPU, no sampler", interval="1m")
        .started(ID, N).silent("RecordingRulesMissing", "1m").silent("RecordingRulesMissing", "39m"),
    ]
