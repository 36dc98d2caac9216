"""The telemetry alerts (group ``otelprof-telemetry``): a target down, a rank, a node's sampler or a GPU gone
silent, telemetry dropped, recording rules not evaluated. Absence never reads as healthy."""

from __future__ import annotations

import dataclasses

from otelprof import dcgm_series as ds
from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.mixin import config as mc
from otelprof.mixin import gpu_source, step_alerts, system_alerts, tensor_alerts, training_alerts
from otelprof.mixin.alert_model import RISK, Alert, AlertGroup, Runbook
from otelprof.mixin.alert_text import AT_GPU, AT_RANK, L_JOB, L_NODE, NUM, human, params
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.gpu_source import GpuReadings
from otelprof.mixin.promql import GPU, HW_ID, IDENTITY, JOB, NODE, RANK, Q, metric_names
from otelprof.mixin.rule_groups import EVALUATED, GROUP_LABEL, rule_groups

NAME = "otelprof-telemetry"

_NOT_OPERATOR_SPANS = f'{sc.prometheus_label(sc.LABEL_EXPORTER)}!="{sc.DROPPED_OPERATOR_SPANS}"'


def alerts(c: MixinConfig) -> list[Alert]:
    """The telemetry alerts in runbook order."""
    q = Q(c.selector)
    lb = c.absent_lookback
    job_label, instance_label = c.target_labels
    up_inner = ", ".join(m for m in (c.up_selector.strip(),) if m)
    up = f"up{{{up_inner}}}" if up_inner else "up"
    start = q.sel(sc.PROCESS_START_TIME)
    target_down = Alert(
        short="TargetDown", group=NAME,
        expr=f"({up} == 0)\n+ on ({job_label}, {instance_label}) group_left ({JOB}, {RANK}, {NODE})\n"
             f"(0 * topk by ({job_label}, {instance_label}) (1, last_over_time({start}[{lb}])))",
        for_=c.absent_for, severity="warning",
        summary="A training process's metrics endpoint cannot be scraped.",
        description=f"Prometheus cannot scrape {{{{ $labels.{instance_label} }}}} ({AT_RANK}), which served otelprof "
                    f"metrics within the last {lb}.",
        dashboard=mc.DASHBOARD_RANKS, labels=(job_label, instance_label, JOB, RANK, NODE),
        runbook=Runbook(
            meaning=f"A scrape target that exposed otelprof metrics within the last {lb} is down: the training "
                    "process died or hangs, or its /metrics endpoint is unreachable. Every other alert about "
                    "this process is blind meanwhile — absence never counts as healthy.",
            thresholds=params(("lookback", lb), ("for", c.absent_for)),
            limit=f"A target that served otelprof metrics within {lb} and fails its scrapes for {c.absent_for}; "
                  f"fires {c.absent_for} after the first failed scrape.",
            todo="Check the pod (kubectl describe/logs): OOM kill, crash, eviction. A process that is alive but "
                 "does not answer scrapes is usually stuck holding the GIL; py-spy dump shows where.",
            deviations="No original: the SageMaker rules ran on files and treated missing data as no data."),
        panel=ids.RANKS_TARGETS, section="rules", kind=RISK,
        knobs=("up_selector", "absent_lookback", "absent_for"),
        offline=None, cases=("telemetry_test.yaml",))

    present = f"group by ({JOB}, {RANK}, {NODE}) ({start})"
    absent = Alert(
        short="TelemetryAbsent", group=NAME,
        expr=f"(\n  group by ({JOB}, {RANK}, {NODE}) (last_over_time({start}[{lb}]))\n"
             f"  unless on ({JOB}, {RANK}) {present}\n)\n"
             f"and on ({JOB}) group by ({JOB}) ({start})",
        for_=c.absent_for, severity="critical",
        summary="A rank stopped reporting while the rest of its job goes on.",
        description=f"{AT_RANK} reported within the last {lb} but its series are gone, while other ranks of the job "
                    "still report.",
        dashboard=mc.DASHBOARD_RANKS, labels=(JOB, RANK, NODE),
        runbook=Runbook(
            meaning=f"This rank's series existed within the last {lb} and vanished while other ranks of the "
                    "same job still report. A rank that died leaves the others hanging in their next "
                    "collective operation.",
            thresholds=params(("lookback", lb), ("for", c.absent_for)),
            limit=f"One rank's series gone (Prometheus marks them stale at the first failed scrape of its "
                  f"target) while other ranks of the job report; fires {c.absent_for} later.",
            todo="Find why the rank ended (pod events, OOM kills, the process's last log lines, NCCL errors). "
                 "The remaining ranks will not make progress: restart the job from its last checkpoint; "
                 "torchrun's elastic restarts (max_restarts) can do this automatically.",
            deviations="No original. A job whose ranks all end at the same time (normal completion) does not "
                       "fire; a single-process job that dies is caught by OtelprofTargetDown while its pod "
                       "is still there."),
        panel=ids.RANKS_REPORTING, section="rules", kind=RISK,
        knobs=("absent_lookback", "absent_for"),
        offline=None, cases=("telemetry_test.yaml",))

    sampling = f"{q.delta(sc.SAMPLER_SAMPLES, c.sampler_window)} > 0"
    system_absent = Alert(
        short="SystemTelemetryAbsent", group=NAME,
        expr=f"group by ({JOB}, {NODE}) ({start})\nunless on ({JOB}, {NODE}) ({sampling})",
        for_=c.absent_for, severity="warning",
        summary="No system telemetry from a node of a running job.",
        description=f"Node {L_NODE} of job {L_JOB}: training processes report but the node's telemetry sampler took no "
                    f"sample in the last {c.sampler_window}.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(JOB, NODE),
        runbook=Runbook(
            meaning=f"Training processes of the job report from this node, but no process there took a "
                    f"system sample in the last {c.sampler_window}. The CPU, I/O and GPU alerts cannot judge "
                    "this node.",
            thresholds=params(("window", c.sampler_window), ("for", c.absent_for)),
            limit=f"A node sampler that takes no sample for {c.sampler_window}; fires "
                  f"{human(seconds(c.sampler_window) + seconds(c.absent_for))} after its last sample.",
            todo="The node's sampler runs in the process whose LOCAL_RANK equals "
                 "OTELPROF_NODE_SAMPLER_LOCAL_RANK (0): check that this process runs, that "
                 "OTELPROF_SYSTEM_METRICS is not false, and otelprof_sampler_errors_total. If system metrics "
                 "are off on purpose, disable this alert (disabled_alerts).",
            deviations="No original."),
        panel=ids.SYSTEM_SAMPLER, section="rules", kind=RISK,
        knobs=("absent_for", "sampler_window"),
        offline=None, cases=("telemetry_test.yaml",))

    gpu_util = q.sel(sc.GPU_UTILIZATION)
    gpu_absent = Alert(
        short="GPUTelemetryAbsent", group=NAME,
        expr=f"(\n  group by ({JOB}, {NODE}, {GPU}) (last_over_time({gpu_util}[{lb}]))\n"
             f"  unless on ({JOB}, {NODE}, {GPU}) group by ({JOB}, {NODE}, {GPU}) ({gpu_util})\n)\n"
             f"and on ({JOB}, {NODE}) ({sampling})\nor {_unmapped(q)}",
        for_=c.absent_for, severity="warning",
        summary="A GPU stopped reporting.",
        description=f"{AT_GPU}: utilization was reported within the last {lb} and is gone, while the node's sampler "
                    "runs.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(JOB, NODE, GPU),
        runbook=Runbook(
            meaning=f"A GPU's series existed within the last {lb} and vanished while the node's sampler still "
                    "samples: NVML stopped answering for this device (GPU lost, XID error, driver trouble). "
                    f"Or (gpu=\"{UNMAPPED_GPU}\") a rank was given a GPU or MIG instance but cannot tell which "
                    "(otelprof_gpu_unmapped, its reason label says why), so no GPU series names its GPU.",
            thresholds=params(("lookback", lb), ("for", c.absent_for)),
            limit=f"One GPU's series gone while the node's sampler samples; fires {c.absent_for} later.",
            todo="Check otelprof_sampler_errors_total{source=\"nvml\"} and the node's kernel log (dmesg) for XID "
                 "errors; a GPU that fell off the bus needs the node drained and the job moved. "
                 f"gpu=\"{UNMAPPED_GPU}\": otelprof_gpu_unmapped{{reason}} — not_found: NVML in the container "
                 "does not list the UUID in NVIDIA_VISIBLE_DEVICES (driver older than R470 for MIG); ambiguous: "
                 "several GPUs visible and LOCAL_RANK names none; otherwise NVML could not start "
                 "(install otelprof[gpu], check the device permissions).",
            deviations="No original."),
        panel=ids.SYSTEM_GPU_UTILIZATION, section="rules", kind=RISK,
        knobs=("gpu_source", "dcgm_pod_label", "dcgm_namespace_label", "absent_lookback", "absent_for",
               "sampler_window"),
        offline=None, cases=("telemetry_test.yaml",))

    if GpuReadings(c).dcgm:
        gpu_absent = _dcgm_absent(c, gpu_absent)

    dropped = Alert(
        short="TelemetryDropped", group=NAME,
        # the operator-span cap per profiled step is a designed bound (the window's statistics count every
        # operator), not lost telemetry
        expr=f"{q.delta(sc.EXPORTER_DROPPED, c.dropped_window, matchers=_NOT_OPERATOR_SPANS)} > 0",
        for_="0s", severity="info",
        summary="otelprof dropped telemetry instead of blocking training.",
        description=f"{AT_RANK}: {NUM} items dropped by the {{{{ $labels.exporter }}}} exporter in the last "
                    f"{c.dropped_window}.",
        dashboard=mc.DASHBOARD_RANKS, labels=(*IDENTITY, sc.prometheus_label(sc.LABEL_EXPORTER), *c.target_labels),
        runbook=Runbook(
            meaning=f"In the last {c.dropped_window} otelprof dropped records, spans or metric exports "
                    "(queue full, collector down, disk full) rather than slow the training loop down. Reports "
                    "and traces of this period are incomplete.",
            thresholds=params(("window", c.dropped_window)),
            limit=f"A single dropped item; fires at the next scrape and rule evaluation and stays firing for "
                  f"{c.dropped_window}.",
            todo="exporter=otlp_*: the OTel collector is down or slow. exporter=recording: the disk is full or "
                 "slow. exporter=queue: raise OTELPROF_QUEUE_SIZE or trace fewer steps (OTELPROF_SPAN_BUDGET). "
                 "exporter=cuda_events: the GPU ran far behind the training loop or no forward ran to read the "
                 "CUDA events; only device times (otelprof_region_device_duration_seconds) are missing.",
            deviations="No original."),
        no_for="one dropped item is a fact, not a trend: reports and traces of the period are incomplete (severity "
               "info).",
        panel=ids.RANKS_DROPPED, section="rules", kind=RISK,
        knobs=("dropped_window",),
        offline=None, cases=("telemetry_test.yaml",))
    return [target_down, absent, system_absent, gpu_absent, dropped, _rules_missing(c)]


def readers(c: MixinConfig) -> tuple[str, ...]:
    """The alerts that go silent without the recording rules, in runbook order (the runbook of
    RecordingRulesMissing names them): those of the other groups whose expression names a record of ``c``'s rules
    file. This group's own alerts watch what is missing instead (with ``gpu_source=dcgm``, GPUTelemetryAbsent
    fires without the otelprof-dcgm group)."""
    recorded = {rule["record"] for group in rule_groups(c) for rule in group["rules"]} - {EVALUATED}
    groups = (system_alerts.GROUP, step_alerts.GROUP, training_alerts.GROUP, tensor_alerts.GROUP)  # a test: all
    return tuple(alert.short for group in groups for alert in group.build(c) if metric_names(alert.expr) & recorded)


def rules_missing_window(c: MixinConfig) -> str:
    """How far back RecordingRulesMissing looks for a group's last evaluation: Prometheus's 5-minute lookback, or
    three recording intervals when those are longer (a slow group is not a missing one)."""
    lookback = int(max(300, 3 * seconds(c.recording_interval or "0s")))
    return "5m" if lookback == 300 else f"{lookback}s"


def _rules_missing(c: MixinConfig) -> Alert:
    """RecordingRulesMissing: processes are scraped, a recording group records nothing (its file not loaded)."""
    w = rules_missing_window(c)
    scraped = f"group by ({JOB}) ({Q(c.selector).sel(sc.PROCESS_START_TIME)})"
    groups = [g["name"] for g in rule_groups(c)]
    per_group = "\n  or ".join(f'label_replace({scraped}, "{GROUP_LABEL}", "{name}", "", "")' for name in groups)
    label = f"{{{{ $labels.{GROUP_LABEL} }}}}"
    return Alert(
        short="RecordingRulesMissing", group=NAME,
        expr=f"(\n  {per_group}\n)\nunless on ({GROUP_LABEL}) last_over_time({EVALUATED}[{w}])",
        for_=c.rules_missing_for, severity="warning",
        summary="The recording rules the alerts read are not evaluated.",
        description=f"Job {L_JOB} is scraped, but the recording group {label} recorded nothing in the last {w}: the "
                    "alerts that read its series cannot fire, and dashboard panels built on it stay empty.",
        dashboard=mc.DASHBOARD_RANKS, labels=(JOB, GROUP_LABEL),
        runbook=Runbook(
            meaning=f"otelprof processes are scraped, but the recording group named in `{GROUP_LABEL}` "
                    f"({', '.join(groups)}) has not been evaluated for {w}. Several alerts read the series "
                    f"these groups record ({', '.join(readers(c))}): without them they stay silent whatever the "
                    "job does, and the dashboards' per-rank and per-job panels are empty. Every group records "
                    f"`{EVALUATED}` = 1 at each evaluation, a rule without input: it is there whenever the "
                    "group runs, also for a stalled job, a node without GPUs or a single rank, when other "
                    "records of the group are empty, so its absence means the group is not evaluated — not "
                    "that the job is quiet. A constant rather than Prometheus's own prometheus_rule_group_* "
                    "metrics: a ruler (Mimir, Thanos) does not expose those where the alerts read, and a "
                    "Prometheus need not scrape itself. The lookback spans three evaluations of a group with a "
                    "long recording_interval; the `for` outlasts a Prometheus or a rule file that has just "
                    "started.",
            thresholds=params(("lookback", w), ("for", c.rules_missing_for)),
            limit=f"A recording group that is not loaded while otelprof processes are scraped; fires "
                  f"{c.rules_missing_for} after their first scrape, or "
                  f"{human(seconds(w) + seconds(c.rules_missing_for))} after the last evaluation of a group that "
                  "was unloaded.",
            todo="Load otelprof-rules.yaml beside otelprof-alerts.yaml (rule_files of prometheus.yml; the "
                 "PrometheusRule and the Mimir namespace file hold both). If it is loaded, look for the group in "
                 "Prometheus's Rules page: an evaluation error (prometheus_rule_evaluation_failures_total) or a "
                 "ruler that refused or split the group (Mimir's rules-per-group limit). Alerts and recording "
                 "rules must be evaluated by the same Prometheus or ruler (tenant).",
            deviations="No original: the SageMaker rules computed everything in one process."),
        panel=ids.RANKS_STRAGGLER, section="rules", kind=RISK,
        knobs=("gpu_source", "rules_missing_for", "recording_interval"),
        offline=None, cases=("rules_missing_test.yaml", "telemetry_test.yaml"))


UNMAPPED_GPU = "unmapped"
"""The ``gpu`` label of GPUTelemetryAbsent for a rank whose GPU cannot be told (``otelprof_gpu_unmapped``)."""


def _unmapped(q: Q) -> str:
    """The nodes of ranks given a GPU they cannot name, as GPUTelemetryAbsent's ``gpu="unmapped"``."""
    return (f'label_replace(group by ({JOB}, {NODE}) ({q.sel(sc.GPU_UNMAPPED)}), "{GPU}", "{UNMAPPED_GPU}", "", '
            '"")')


def _dcgm_absent(c: MixinConfig, declared: Alert) -> Alert:
    """GPUTelemetryAbsent with ``gpu_source=dcgm``: a rank's GPU that dcgm-exporter's joined series lack (the
    ``declared`` alert with this expression and these texts)."""
    q = Q(c.selector)
    info = q.sel(sc.GPU_INFO)
    record = gpu_source.record_name(sc.GPU_UTILIZATION)
    return dataclasses.replace(
        declared,
        expr=f"group by ({JOB}, {NODE}, {GPU}) (\n  {info}\n  unless on ({JOB}, {RANK}, {HW_ID}) {record}\n)\n"
             f"or {_unmapped(q)}",
        for_=c.absent_for, severity="warning",
        summary="No dcgm-exporter series for a GPU of the job.",
        description=f"{AT_GPU}: a rank computes on this GPU (otelprof_gpu_info) but no dcgm-exporter utilization "
                    "joins to it.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(JOB, NODE, GPU),
        runbook=Runbook(
            meaning="A training process names the GPU it computes on (otelprof_gpu_info, with the GPU's UUID and "
                    f"its pod), and no {ds.DCGM_GPU_UTIL} series with that UUID and pod is there "
                    f"({ds.DCGM_GR_ENGINE_ACTIVE} for a MIG instance, with its GPU_I_ID): dcgm-exporter "
                    "does not run on the node, is not scraped, lost the GPU, or its pod labels do not name the "
                    "training pod, so every GPU alert of this job has nothing to judge. "
                    f"gpu=\"{UNMAPPED_GPU}\": a rank was given a GPU or MIG instance but cannot tell which "
                    "(otelprof_gpu_unmapped{reason}), so it exports no otelprof_gpu_info to join.",
            thresholds=params(("for", c.absent_for), ("dcgm_pod_label", c.dcgm_pod_label),
                               ("dcgm_namespace_label", c.dcgm_namespace_label)),
            limit=f"One GPU of the job without a joined dcgm-exporter series; fires {c.absent_for} after the "
                  "recording rule otelprof-dcgm last joined it (at once when it never did).",
            todo=f"Query {ds.DCGM_GPU_UTIL}{{UUID=\"<hw_id of the alert>\"}}: absent -> dcgm-exporter or its "
                 "scrape; present -> compare its pod/namespace labels (exported_pod with the ServiceMonitor's "
                 "honorLabels: false) with the mixin's dcgm_pod_label / dcgm_namespace_label, and check that "
                 "dcgm-exporter's pod attribution (kubelet pod-resources socket) is on.",
            deviations="No original."))


GROUP = AlertGroup(NAME, alerts)
