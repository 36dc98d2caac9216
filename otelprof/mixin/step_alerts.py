"""The step alerts (group ``otelprof-steps``): stragglers, outlier steps, slow initialization, data-loader
workers, input-bound steps."""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof import thresholds
from otelprof.dashboards import ids
from otelprof.mixin import config as mc
from otelprof.mixin.alert_model import CAUSE, OFFLINE_STEPS, RISK, SYMPTOM, Alert, AlertGroup, Runbook
from otelprof.mixin.alert_text import AT_RANK, DUR, L_JOB, L_NODE, L_PHASE, NUM, PCT, human, params, pct
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.promql import IDENTITY, JOB, NODE, PHASE, RANK, Q, number
from otelprof.mixin.rules import reuse, step_compute

NAME = "otelprof-steps"


def alerts(c: MixinConfig) -> list[Alert]:
    """The step alerts in runbook order."""
    q = Q(c.selector)
    sw = c.straggler_window
    # each rank's compute time per step, as the recording group computed it (ranks with steps in the window)
    compute = reuse(c, "step_compute_mean", step_compute(q, sw))
    g = f"on ({JOB}, {PHASE})"
    ranks = f"count by ({JOB}, {PHASE}) ({compute})"
    # A rank against the median of the *other* ranks. PromQL cannot leave a series out of its own group's
    # aggregation, so: with 2-3 ranks that median is the mean of the others, (sum - x) / (n - 1); with 4 or
    # more, a rank that can be slower than its peers sits above the job's median, and the median of the others
    # is then the largest value not above the job's median (exact for every even n; for odd n >= 5 the job's
    # median itself, at most one rank's worth above the exact one, so the alert errs on the quiet side).
    peers_few = (f"{compute}\n  * {g} group_left () ({ranks} - 1)\n"
                 f"  / (sum by ({JOB}, {PHASE}) ({compute}) - {g} group_right () {compute} > 0)\n"
                 f"  and {g} {ranks} < 4")
    peers_many = (f"{compute}\n  / {g} group_left ()\n  (max by ({JOB}, {PHASE}) ({compute} <= {g} group_left () "
                  f"quantile by ({JOB}, {PHASE}) (0.5, {compute})) > 0)\n  and {g} {ranks} > 3")
    sws, sfor = seconds(sw), seconds(c.straggler_for)
    straggler = Alert(
        short="RankStraggler", group=NAME,
        expr=f"(\n  {peers_few}\nor\n  {peers_many}\n)\n> {number(c.straggler_ratio)}\n"
             f"and {g} {ranks} > 1",
        for_=c.straggler_for, severity="warning",
        summary="One rank is slower than the others.",
        description=f"{AT_RANK}: its {L_PHASE} steps take {NUM} times the median of its peers' compute time per step "
                    f"(step time less exposed collective time) over the last {sw}.",
        dashboard=mc.DASHBOARD_RANKS, labels=(*IDENTITY, PHASE, *c.target_labels),
        runbook=Runbook(
            meaning=f"This rank's mean compute time per step (step time minus its exposed communication: the time "
                    f"its gradient all-reduces were in flight and its backward pass had nothing left to compute) "
                    f"over the last {sw} is more than {c.straggler_ratio:g} times the median "
                    "over the job's other ranks. In synchronous data parallel training every rank waits for the "
                    "slowest, so one straggler slows the whole job.",
            thresholds=params(("window", sw), ("ratio", c.straggler_ratio), ("for", c.straggler_for)),
            limit=f"A rank more than {(c.straggler_ratio - 1) * 100:g} % slower than the median of its peers, at "
                  f"any world size from 2. A rank that slows down to k times its peers' step fires once more than "
                  f"{c.straggler_ratio - 1:g} / (k - 1) of its steps in the {sw} window are slow, then `for` "
                  f"{c.straggler_for}: at the latest {human(sws + sfor)} after the slowdown.",
            todo="Compare the node's telemetry with the other nodes': CPU throttling "
                 "(otelprof_container_cpu_throttled_periods_total), a GPU at a lower clock or thermally "
                 "throttled (otelprof_gpu_throttle), a slower data path on that node, or uneven input sizes. "
                 "The captured window (action `capture`, sent to this rank only) shows where its time goes. "
                 "On GPUs, the \"Communication/computation overlap\" panel of the training report (and the "
                 "report's section of that name) gives each rank's exposed communication per step from its "
                 "profiling windows' kernels: the ranks that wait for the straggler show the most exposed "
                 "all-reduce time, the straggler itself the least.",
            deviations="No original. The peers' median is exact for 2, 3 and 4 ranks and any even number; with "
                       "an odd number of 5 or more ranks it is the job's median, which is at most one rank's "
                       "compute time above the exact one (the alert errs on the quiet side). The collective "
                       "time comes from the DDP integration; without it the plain step time is compared."),
        panel=ids.RANKS_STRAGGLER, section="balance", kind=CAUSE,
        knobs=("straggler_window", "straggler_ratio", "straggler_for"),
        offline=OFFLINE_STEPS, cases=("steps_test.yaml",))

    ow = c.step_outlier_window
    outlier_rule = (f"slower than the mean + {c.step_outlier_sigma:g} standard deviations of its phase's last "
                    f"{thresholds.OUTLIER_WINDOW} steps, and at least {c.step_outlier_min_ratio:g} times and "
                    f"{c.step_outlier_min_excess * 1000:g} ms more than their median; where the step recorded its "
                    "tokens (else its samples), also slower per token than those steps by the same tests")
    cost = f"{q.delta(sc.STEP_OUTLIER_EXCESS, ow)}\n/ {q.delta(sc.STEP_DURATION, ow, 'sum')}"
    outliers = Alert(
        short="StepOutliers", group=NAME,
        expr=f"{cost}\n> {number(c.step_outlier_min_cost)}\n"
             f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEP_OUTLIERS, ow)} > {c.step_outlier_n_outliers}\n"
             f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEPS, ow)} > {c.step_outlier_min_steps}",
        for_="0s", severity="warning",
        summary="Outlier steps cost a material share of training time.",
        description=f"{AT_RANK}: outlier {L_PHASE} steps lost {PCT} of the last {ow}'s step time (their time above the "
                    "median step). Open them on the timeline: each is traced.",
        dashboard=mc.DASHBOARD_TIMELINE, labels=(*IDENTITY, PHASE, *c.target_labels),
        runbook=Runbook(
            meaning=f"Over the last {ow}, the outlier steps' time above the median step was more than "
                    f"{pct(c.step_outlier_min_cost)} of the phase's step time, over more than "
                    f"{c.step_outlier_n_outliers} outliers (of more than {c.step_outlier_min_steps} steps). An "
                    f"outlier is a step {outlier_rule}. Steps of an operator-profiling window and the "
                    f"{thresholds.AFTER_WINDOW_STEPS} steps after it (which otelprof itself slows: the profiler, "
                    "the FLOP count) are never judged. Every outlier step is traced, so its spans show where the "
                    "time went.",
            thresholds=params(("window", ow), ("min_cost", pct(c.step_outlier_min_cost)),
                               ("n_outliers", c.step_outlier_n_outliers),
                               ("min_steps", c.step_outlier_min_steps),
                               ("stddev (in process, OTELPROF_OUTLIER_SIGMA)", f"{c.step_outlier_sigma:g}"),
                               ("min_ratio (in process, OTELPROF_OUTLIER_MIN_RATIO)", f"{c.step_outlier_min_ratio:g}"),
                               ("min_excess (in process, OTELPROF_OUTLIER_MIN_EXCESS_MS)",
                                f"{c.step_outlier_min_excess * 1000:g} ms")),
            limit=f"Outliers that lose more than {pct(c.step_outlier_min_cost)} of the step time: one step in m "
                  f"that takes x times the median step costs (x - 1) / m, so a stall of 3 times the step every "
                  f"{int(2 / c.step_outlier_min_cost)} steps or more often, a stall of 10 times every "
                  f"{int(9 / c.step_outlier_min_cost)} steps. Fires at the evaluation after the window holds "
                  f"more than {c.step_outlier_n_outliers} such outliers (no `for`): at the latest {ow} after "
                  "they start. A long batch that is not slower per token, scheduler delays below "
                  f"{c.step_outlier_min_excess * 1000:g} ms, and outliers that cost the job less never fire.",
            todo="Open the outlier steps on the timeline dashboard (they are always traced) and look for the "
                 "region that grew: data loading (see the bottleneck alerts), checkpointing or evaluation "
                 "inside the loop, garbage collection, or interference from other processes on the node. The "
                 "alert's value is the share of step time they cost: what fixing them gains.",
            deviations="The original counted outliers over all steps since the start (and latched once it "
                       f"had more than 10); this judges the last {ow}, by what the outliers cost. The outlier test "
                       f"runs in the training process against the last {thresholds.OUTLIER_WINDOW} steps of the "
                       "phase (population standard deviation, upward only, as in the original) after "
                       "OTELPROF_OUTLIER_MIN_STEPS steps. New: an outlier must also be materially slower than the "
                       f"median step ({c.step_outlier_min_ratio:g} times and "
                       f"{c.step_outlier_min_excess * 1000:g} ms: scheduler jitter on a busy machine passes mean + "
                       "3 sigma every few dozen steps), slower per token or sample where those are recorded "
                       "(variable-length batches keep ~2 % of the steps above mean + 3 sigma for good), and the "
                       f"outliers must cost more than {pct(c.step_outlier_min_cost)} of the step time; steps "
                       "otelprof's own profiling slowed are left out.",
            original="StepOutlier"),
        no_for="one evaluation weighs every outlier step of the window by its time above the median against all the "
               "window's step time (a share, over more than 10 outliers): the window is the `for`.",
        panel=ids.TIMELINE_OUTLIER_TRACES, section="steps", kind=SYMPTOM,
        knobs=("step_outlier_sigma", "step_outlier_min_ratio", "step_outlier_min_excess", "step_outlier_window",
               "step_outlier_n_outliers", "step_outlier_min_steps", "step_outlier_min_cost"),
        offline=OFFLINE_STEPS, cases=("steps_test.yaml",))

    init_limit = int(seconds(c.max_initialization_time))
    slow_init = Alert(
        short="SlowInitialization", group=NAME,
        expr=f"{q.age()} > {init_limit}\nunless on ({JOB}, {RANK}) {q.sel(sc.STEP_FIRST_TIMESTAMP)}",
        for_="0s", severity="warning",
        summary="Training has not started its first step.",
        description=f"{AT_RANK}: started {DUR} ago and has not begun its first step.",
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=(*IDENTITY, *c.target_labels),
        runbook=Runbook(
            meaning=f"The process started more than {c.max_initialization_time} ago and no training step has "
                    "begun yet.",
            thresholds=params(("threshold", c.max_initialization_time)),
            limit=f"A process whose first step has not begun {c.max_initialization_time} after it started; fires "
                  f"exactly then (no `for`).",
            todo="Look at the annotated initialization regions (otelprof_annotation_duration_seconds with "
                 "phase none) and the process's CPU and I/O: data set download or indexing, model weight "
                 "loading, compilation (torch.compile), or a distributed rendezvous waiting for missing "
                 "ranks (check that every rank's pod is running).",
            deviations="The original measured from the first system sample and never fired inside the "
                       "profiler report (a bug); this measures from the process start time and fires while "
                       "the first step is still missing, then resolves.",
            original="MaxInitializationTime"),
        no_for="the condition is itself a duration (no first step that long after start); a `for` would only add to "
               "it.",
        panel=ids.REPORT_INITIALIZATION, section="summary", kind=CAUSE,
        knobs=("max_initialization_time",),
        offline=OFFLINE_STEPS, cases=("steps_test.yaml",))

    workers = f"sum by ({JOB}, {NODE}) ({q.sel(sc.DATALOADER_WORKERS)})"
    cores = f"max by ({JOB}, {NODE}) ({q.sel(sc.CPU_AVAILABLE)})"
    loader_dev = ("The original counted data-loader worker processes seen in the framework trace per second "
                  "and compared the median with the node's logical cores. Here the PyTorch integration "
                  "reports the configured workers of each rank's loader (summed per node) and the sampler "
                  "reports the CPUs the container may use (the cgroup quota, else the affinity mask), so a "
                  "pod limited to 8 of 64 cores is judged against 8.")
    too_few = Alert(
        short="TooFewDataLoaderWorkers", group=NAME,
        expr=f"{workers}\n< {number(c.dataloader_min_threshold)} * {cores}",
        for_=c.dataloader_for, severity="info",
        summary="Few data-loader workers for the CPUs available.",
        description=f"Node {L_NODE} (job {L_JOB}) runs {NUM} data-loader workers in total, fewer than "
                    f"{pct(c.dataloader_min_threshold)} of the CPUs the container may use.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(JOB, NODE),
        runbook=Runbook(
            meaning=f"The data loaders of the node's ranks together run fewer worker processes than "
                    f"{pct(c.dataloader_min_threshold)} of the CPUs the container may use.",
            thresholds=params(("min_threshold", pct(c.dataloader_min_threshold)), ("for", c.dataloader_for)),
            limit=f"Fewer workers than {pct(c.dataloader_min_threshold)} of the container's CPUs; fires "
                  f"{c.dataloader_for} after the loaders report their workers.",
            todo="If steps are input-bound (OtelprofInputBound, OtelprofCPUBottleneck) raise num_workers "
                 "towards the available CPUs divided by the ranks on the node; otherwise this is harmless.",
            deviations=loader_dev, original="Dataloader"),
        panel=ids.SYSTEM_DATALOADER_WORKERS, section="dataloader", kind=CAUSE,
        knobs=("dataloader_min_threshold", "dataloader_for"),
        offline=None, cases=("steps_test.yaml",))
    too_many = Alert(
        short="TooManyDataLoaderWorkers", group=NAME,
        expr=f"{workers}\n> {number(c.dataloader_max_threshold)} * {cores}",
        for_=c.dataloader_for, severity="info",
        summary="More data-loader workers than the CPUs can run.",
        description=f"Node {L_NODE} (job {L_JOB}) runs {NUM} data-loader workers in total, more than "
                    f"{pct(c.dataloader_max_threshold)} of the CPUs the container may use.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(JOB, NODE),
        runbook=Runbook(
            meaning=f"The data loaders of the node's ranks together run more than "
                    f"{pct(c.dataloader_max_threshold)} of the container's CPUs in worker processes: they "
                    "compete for cores (and memory) with each other and the training processes.",
            thresholds=params(("max_threshold", pct(c.dataloader_max_threshold)), ("for", c.dataloader_for)),
            limit=f"More workers than {pct(c.dataloader_max_threshold)} of the container's CPUs; fires "
                  f"{c.dataloader_for} after the loaders report their workers.",
            todo="Lower num_workers; with a CPU limit on the pod, size workers to the limit, not to the node's "
                 "cores (os.cpu_count() reports the node). Watch CPU throttling after the change.",
            deviations=loader_dev, original="Dataloader"),
        panel=ids.SYSTEM_DATALOADER_WORKERS, section="dataloader", kind=RISK,
        knobs=("dataloader_max_threshold", "dataloader_for"),
        offline=None, cases=("steps_test.yaml",))

    iw = c.input_bound_window
    input_bound = Alert(
        short="InputBound", group=NAME,
        expr=f"{reuse(c, 'dataloader_wait_ratio', q.window_mean(sc.DATALOADER_WAIT_RATIO, iw))} "
             f"> {number(c.input_bound_threshold)}",
        for_=c.input_bound_for, severity="warning",
        summary="Steps spend most of their time waiting for data.",
        description=f"{AT_RANK}: {L_PHASE} steps spent on average {PCT} of their time waiting for the next batch over "
                    f"the last {iw}.",
        dashboard=mc.DASHBOARD_RANKS, labels=(*IDENTITY, PHASE, *c.target_labels),
        runbook=Runbook(
            meaning=f"Averaged over the steps of the last {iw}, more than {pct(c.input_bound_threshold)} of "
                    "each step was spent waiting for the data loader to hand over the next batch.",
            thresholds=params(("window", iw), ("threshold", pct(c.input_bound_threshold)),
                               ("for", c.input_bound_for)),
            limit=f"Steps waiting for data more than {pct(c.input_bound_threshold)} of their time on average. When "
                  f"the loader slows so that steps wait a share s of their time, fires once more than "
                  f"{c.input_bound_threshold:g} / s of the window's steps are slow, then `for` {c.input_bound_for}: "
                  f"at the latest {human(seconds(iw) + seconds(c.input_bound_for))} after the slowdown.",
            todo="Make the input pipeline faster than the model: more loader workers, prefetching, "
                 "pin_memory, persistent_workers, cheaper decoding or preprocessing done once offline, faster "
                 "storage. The CPU and I/O bottleneck alerts tell which resource the loader lacks.",
            deviations="No original (SageMaker's Dataloader rule only counted workers). Measured per step from "
                       "the time spent inside the data-loader region, so it is exact for every step."),
        panel=ids.RANKS_WAIT_RATIO, section="dataloader", kind=CAUSE,
        knobs=("input_bound_threshold", "input_bound_window", "input_bound_for"),
        offline=OFFLINE_STEPS, cases=("steps_test.yaml",))
    return [straggler, outliers, slow_init, too_few, too_many, input_bound]


GROUP = AlertGroup(NAME, alerts)
