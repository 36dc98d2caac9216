"""A recording as a Chrome trace / Perfetto timeline (JSON trace-event format).

One process per rank with tracks for its steps (outlier steps marked), the regions inside steps
(one track per nesting depth, more lanes where regions overlap; a step's collective and exposed communication
time in its arguments), regions outside steps and
lifecycle moments, and operator-profiling windows; for profiled steps the operators (one track per host
thread, nested as they ran), the GPU kernels and copies (one track per device and stream) and a flow arrow
from each launching operator to its kernel; the device (CUDA event) time of each step's regions on a track
of its own; per rank counters of its own CPU and memory;
one process per node with counter tracks for CPU (mean and busiest core), I/O wait, host memory,
and each GPU's utilization and memory. Times are microseconds since the run's first record (its
Unix time is in ``otherData``). Long runs are cut to a window of steps so the file stays small
enough for a browser: ``from_step``/``to_step`` (step numbers of one phase: exactly those steps of each
rank, and what else of the rank falls inside their time span, whatever the other ranks' timing) or the
first ``max_steps`` steps per rank.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof import semconv as sc
from otelprof.analysis.run import RunView
from otelprof.analysis.steps import outlier_flags
from otelprof.analysis.system import gpu_order
from otelprof.recording.ranks import Recording
from otelprof.recording.selection import StepSelection, select_steps
from otelprof.shared import collectives

DEFAULT_MAX_STEPS = 2000
NODE_PID_BASE = 100_000
TID_STEPS, TID_OUTSIDE, TID_PROFILES, TID_DEVICE_TIME, TID_REGIONS = 1, 2, 3, 4, 10
TID_OPERATORS = 50_000
"""Host operator tracks: this plus the lane (one per thread and overlap lane)."""
TID_DEVICE = 60_000
"""GPU stream tracks: this plus ``device * 1000 + stream % 1000``."""
DEVICE_KINDS = ("kernel", "memcpy", "memset")
ARG_COLLECTIVE = "collective ms"
"""Step argument: milliseconds with at least one all-reduce in flight (:mod:`otelprof.shared.collectives`)."""
ARG_EXPOSED = "exposed communication ms"
"""Step argument: milliseconds of it the backward pass did not overlap."""


@dataclass(frozen=True)
class TimelineWindow:
    start_ns: int
    end_ns: int
    steps: int
    """Steps included (all ranks)."""
    total_steps: int
    truncated: bool
    description: str
    selected: tuple[StepSelection, ...] | None = None
    """With a step range: each rank's steps and span (in the view's rank order)."""


OVERLAP_TOLERANCE_NS = 1000
"""Slices that overlap the previous one by less than this (clock conversion jitter) are moved to start at
its end instead of opening another lane."""


@dataclass
class _Lanes:
    """Assigns overlapping slices to separate lanes (tracks) so every track nests properly."""

    ends: list[list[tuple[int, int]]] = field(default_factory=list)

    def place(self, start: int, end: int) -> tuple[int, int]:
        """(lane, start) for a slice; the start moves by at most OVERLAP_TOLERANCE_NS."""
        for lane, stack in enumerate(self.ends):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and not (stack[-1][0] <= start and end <= stack[-1][1]):
                top = stack[-1]
                if top[1] - start <= OVERLAP_TOLERANCE_NS and end > top[1]:
                    stack.pop()
                    while stack and stack[-1][1] <= top[1]:
                        stack.pop()
                    if not stack or end <= stack[-1][1]:
                        stack.append((top[1], end))
                        return lane, top[1]
                continue
            stack.append((start, end))
            return lane, start
        self.ends.append([(start, end)])
        return len(self.ends) - 1, start


def _window(view: RunView, from_step: int | None, to_step: int | None, max_steps: int | None,
            phase: str) -> TimelineWindow:
    total = sum(len(r.step_columns) for r in view.ranks)
    if from_step is not None or to_step is not None:
        return _selected_window(view, from_step, to_step, max_steps, phase)
    lo, hi = -(1 << 62), 1 << 62
    limit = max_steps if max_steps is not None else DEFAULT_MAX_STEPS
    truncated = False
    if limit is not None:
        cut = hi
        for rank in view.ranks:
            c = rank.step_columns
            first = bisect.bisect_left(c.start_ns, lo)
            if len(c) - first > limit:
                cut = min(cut, c.start_ns[first + limit - 1] + c.duration_ns[first + limit - 1])
                truncated = True
        hi = cut
    count = sum(1 for rank in view.ranks for s, d in zip(rank.step_columns.start_ns, rank.step_columns.duration_ns)
                if s >= lo and s + d <= hi)
    what = "the whole run"
    if truncated:
        what += f", cut after {limit} steps per rank"
    return TimelineWindow(lo, hi, count, total, truncated, what)


def _selected_window(view: RunView, from_step: int | None, to_step: int | None, max_steps: int | None,
                     phase: str) -> TimelineWindow:
    """Each rank's own steps ``from_step`` .. ``to_step`` of ``phase`` (the first ``max_steps`` of them) and
    the steps of other phases inside their span."""
    selected = tuple(select_steps(r.step_columns, phase, from_step, to_step, max_steps) for r in view.ranks)
    count = 0
    for rank, sel in zip(view.ranks, selected):
        count += sum(1 for i in range(len(rank.step_columns)) if _shows_step(rank.step_columns, i, sel, phase))
    spans = [sel for sel in selected if sel.rows]
    lo, hi = (min(x.start_ns for x in spans), max(x.end_ns for x in spans)) if spans else (0, -1)
    truncated = any(sel.truncated for sel in selected)
    what = f"{phase} steps {from_step if from_step is not None else 'first'} to " \
           f"{to_step if to_step is not None else 'last'} of each rank"
    if truncated:
        what += f", cut after {max_steps} steps per rank"
    total = sum(len(r.step_columns) for r in view.ranks)
    return TimelineWindow(lo, hi, count, total, truncated, what, selected)


def _shows_step(c: Any, i: int, sel: StepSelection, phase: str) -> bool:
    """A selected step, or a step of another phase inside the selected steps' span."""
    if i in sel.rows:
        return True
    start: int = c.start_ns[i]
    end: int = start + c.duration_ns[i]
    return bool(c.phase_names[c.phase[i]] != phase and sel.start_ns <= start and end <= sel.end_ns)


def _step_filter(c: Any, sel: StepSelection | None, phase: str,
                 inside: Callable[[int, int], bool]) -> Callable[[int], bool]:
    """Whether the rank's step ``i`` is shown: by the selection, else by the time window."""
    if sel is not None:
        return lambda i: _shows_step(c, i, sel, phase)
    return lambda i: inside(c.start_ns[i], c.start_ns[i] + c.duration_ns[i])


def build_timeline(recording: Recording, from_step: int | None = None, to_step: int | None = None,
                   max_steps: int | None = None, phase: str = "train", counters: bool = True) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents``, ``displayTimeUnit``, ``otherData``)."""
    view = RunView(recording)
    window = _window(view, from_step, to_step, max_steps, phase)
    origin_ns = int((view.first_time() or 0.0) * 1e9)
    whole = window.selected is None and not window.truncated

    def ts(t_ns: int) -> float:
        return round((t_ns - origin_ns) / 1e3, 3)

    def span(lo: int, hi: int) -> Callable[[int, int], bool]:
        return lambda start, end: whole or (start >= lo and end <= hi)

    node_spans: dict[str, tuple[int, int]] = {}
    meta: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    flows: dict[tuple[int, str, int], int] = {}
    for index, (rank, info) in enumerate(zip(view.ranks, view.info)):
        pid = info.rank + 1
        meta += _process(pid, f"rank {info.rank} ({info.node})", info.rank)
        meta += _thread(pid, TID_STEPS, "steps", 0)
        c = rank.step_columns
        sel = window.selected[index] if window.selected is not None else None
        lo, hi = (sel.start_ns, sel.end_ns) if sel is not None else (window.start_ns, window.end_ns)
        inside = span(lo, hi)
        if sel is None or sel.rows:
            low, high = node_spans.get(info.node, (lo, hi))
            node_spans[info.node] = (min(low, lo), max(high, hi))
        shows = _step_filter(c, sel, phase, inside)
        flags = outlier_flags(view, index) if len(c) else []
        lanes: dict[int, _Lanes] = {}
        step_lanes = _Lanes()
        lane_names: set[tuple[int, int]] = set()
        first = 0 if whole else bisect.bisect_left(c.start_ns, lo)
        collective, exposed = collectives.of_columns(c)
        for i in range(first, len(c)):
            start, duration = c.start_ns[i], c.duration_ns[i]
            if not shows(i):
                if start > hi:
                    break
                continue
            step_phase = c.phase_names[c.phase[i]]
            args: dict[str, Any] = {"phase": step_phase, "number": c.number[i]}
            for j in range(c.scalar_index[i], c.scalar_index[i + 1]):
                value = c.scalar_value[j]
                if math.isfinite(value):
                    args[c.scalar_names[c.scalar_name[j]]] = value
            if i in c.errors:
                args["error"] = c.errors[i]
            if collective[i]:  # the all-reduces' union and the part of it the rank only waited
                args[ARG_COLLECTIVE] = collective[i] / 1e6
                args[ARG_EXPOSED] = exposed[i] / 1e6
            name = f"{step_phase} step {c.number[i]}"
            step_lane, shown = step_lanes.place(start, start + duration)
            step_tid = TID_STEPS + 1000 * step_lane
            if step_lane and (-2, step_lane) not in lane_names:
                lane_names.add((-2, step_lane))
                meta += _thread(pid, step_tid, f"steps ({step_lane + 1})", 0)
            if flags and flags[i]:
                args["outlier"] = True
                events.append({"name": f"outlier: {name}", "cat": "outlier", "ph": "i", "s": "t", "pid": pid,
                               "tid": step_tid, "ts": ts(shown), "args": {"duration_ms": duration / 1e6}})
            events.append({"name": name, "cat": "outlier step" if args.get("outlier") else "step", "ph": "X",
                           "pid": pid, "tid": step_tid, "ts": ts(shown), "dur": (start + duration - shown) / 1e3,
                           "args": args,
                           **({"cname": "terrible"} if args.get("outlier") else {})})
            for j in range(c.ann_index[i], c.ann_index[i + 1]):
                a_start = start + c.ann_offset[j]
                a_end = a_start + c.ann_duration[j]
                depth = c.ann_depth[j]
                lane, shown = lanes.setdefault(depth, _Lanes()).place(a_start, a_end)
                tid = TID_REGIONS + depth * 10 + lane
                if (depth, lane) not in lane_names:
                    lane_names.add((depth, lane))
                    label = "regions" if depth == 0 else f"regions, depth {depth}"
                    meta += _thread(pid, tid, label + (f" ({lane + 1})" if lane else ""), tid)
                events.append({"name": c.ann_names[c.ann_name[j]], "cat": "region", "ph": "X", "pid": pid, "tid": tid,
                               "ts": ts(shown), "dur": (a_end - shown) / 1e3, "args": {"step": c.number[i]}})
        meta += _thread(pid, TID_OUTSIDE, "outside steps", 1)
        outside = _Lanes()
        for a in rank.annotations:
            if inside(a.start_ns, a.start_ns + a.duration_ns):
                lane, shown = outside.place(a.start_ns, a.start_ns + a.duration_ns)
                events.append({"name": a.name, "cat": "region", "ph": "X", "pid": pid, "tid": TID_OUTSIDE + 1000 * lane,
                               "ts": ts(shown), "dur": (a.start_ns + a.duration_ns - shown) / 1e3,
                               "args": {"phase": a.phase}})
                if lane and (-1, lane) not in lane_names:
                    lane_names.add((-1, lane))
                    meta += _thread(pid, TID_OUTSIDE + 1000 * lane, f"outside steps ({lane + 1})", 1)
        for key, moment in rank.lifecycle.items():
            if moment is not None and inside(int(moment * 1e9), int(moment * 1e9)):
                events.append({"name": key.replace("_", " "), "cat": "lifecycle", "ph": "i", "s": "p", "pid": pid,
                               "tid": TID_OUTSIDE, "ts": ts(int(moment * 1e9))})
        profiles = [p for p in rank.profiles() if inside(int(p.get("t", 0)), int(p.get("t", 0)) + int(p.get("d", 0)))]
        if profiles:
            meta += _thread(pid, TID_PROFILES, "operator profiling", 2)
        for p in profiles:
            top = {f"cpu {op['name']}": round(float(op.get("self_s", 0.0)) * 1e3, 3)
                   for op in (p.get("cpu_ops") or [])[:10]}
            top |= {f"gpu {op['name']}": round(float(op.get("self_s", 0.0)) * 1e3, 3)
                    for op in (p.get("gpu_ops") or [])[:10]}
            events.append({"name": f"torch.profiler steps {p.get('start_step')}+{p.get('num_steps')}",
                           "cat": "profile", "ph": "X", "pid": pid, "tid": TID_PROFILES, "ts": ts(int(p["t"])),
                           "dur": int(p.get("d", 0)) / 1e3,
                           "args": {"self time ms": top, "trace_file": p.get("trace_file")}})
        meta += _device_time_track(rank, pid, events, ts, shows)
        meta += _operator_tracks(rank, pid, events, ts, inside, flows)
        if counters:
            s = view.samples(index)
            for t, pcpu, rss in zip(s.t_ns, s.pcpu, s.rss):
                if inside(t, t):
                    if pcpu == pcpu:
                        events.append(_counter(pid, "process CPU %", ts(t), {"cpu": round(pcpu * 100, 2)}))
                    if rss == rss:
                        events.append(_counter(pid, "process RSS MiB", ts(t), {"rss": round(rss / 2**20, 1)}))
    if counters:
        for n, (node, (_, s)) in enumerate(view.nodes().items()):
            pid = NODE_PID_BASE + n
            meta += _process(pid, f"node {node}", 10_000 + n)
            gpus = sorted(s.gpus, key=gpu_order)
            inside = span(*node_spans.get(node, (0, -1)))  # the span of its ranks' steps shown
            for i, t in enumerate(s.t_ns):
                if not inside(t, t):
                    continue
                at = ts(t)
                _maybe(events, pid, "CPU %", at, {"mean": s.cpu_mean[i], "busiest core": s.cpu_max[i]}, 100)
                _maybe(events, pid, "I/O wait %", at, {"mean": s.iow_mean[i], "busiest core": s.iow_max[i]}, 100)
                _maybe(events, pid, "host memory %", at, {"used": s.mem[i]}, 100)
                if gpus:
                    _maybe(events, pid, "GPU utilization %", at, {f"gpu{g}": s.gpus[g]["u"][i] for g in gpus
                                                                  if "u" in s.gpus[g]}, 100)
                    _maybe(events, pid, "GPU memory %", at, {
                        f"gpu{g}": s.gpus[g]["mu"][i] / s.gpus[g]["mt"][i] for g in gpus
                        if "mu" in s.gpus[g] and "mt" in s.gpus[g] and s.gpus[g]["mt"][i]}, 100)
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "otelprof timeline", "run_id": recording.run_id, "origin_unix_ns": origin_ns,
                      "window": window.description, "steps_in_window": window.steps,
                      "steps_in_run": window.total_steps, "skipped_lines": recording.skipped_lines,
                      "regions": sorted({n for r in view.ranks for n in r.step_columns.ann_names}),
                      "dataloader_region": sc.REGION_DATALOADER},
    }


def _device_time_track(rank: Any, pid: int, events: list[dict[str, Any]], ts: Any,
                       shows: Callable[[int], bool]) -> list[dict[str, Any]]:
    """Each step's CUDA-event region times on one track. The events give durations only, so a region is drawn
    where one stream would have run it: from its host region's start, or the end of the previous region's
    device work when that is later (the GPU was still busy); ``args`` carry the host time beside it."""
    if not rank.device_times:
        return []
    by_step: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for d in rank.device_times:
        if d.number is not None:
            by_step.setdefault((d.phase, d.number), []).append((d.name, d.duration_ns))
    c = rank.step_columns
    shown_any = False
    for i in range(len(c)):
        start = c.start_ns[i]
        if not shows(i):
            continue
        regions = by_step.pop((c.phase_names[c.phase[i]], c.number[i]), None)  # a step number repeated: once
        if not regions:
            continue
        host: dict[str, tuple[int, int]] = {}
        for j in range(c.ann_index[i], c.ann_index[i + 1]):
            name = c.ann_names[c.ann_name[j]]
            host.setdefault(name, (start + c.ann_offset[j], c.ann_duration[j]))
        free = start
        for name, duration in regions:
            host_start, host_duration = host.get(name, (free, 0))
            begin = max(host_start, free)
            events.append({"name": f"{name} (device)", "cat": "device time", "ph": "X", "pid": pid,
                           "tid": TID_DEVICE_TIME, "ts": ts(begin), "dur": duration / 1e3,
                           "args": {"step": c.number[i], "device_ms": duration / 1e6, "host_ms": host_duration / 1e6,
                                    "start": "estimated (CUDA events time durations)"}})
            free = begin + duration
            shown_any = True
    return _thread(pid, TID_DEVICE_TIME, "device time (CUDA events)", 2) if shown_any else []


def _operator_tracks(rank: Any, pid: int, events: list[dict[str, Any]], ts: Any, inside: Any,
                     flows: dict[tuple[int, str, int], int]) -> list[dict[str, Any]]:
    """Operator spans of profiled steps (spans.jsonl): host operators on per-thread tracks (lanes where two
    overlap without nesting), kernels and copies on per-stream tracks, and a launch->kernel flow for each
    device span whose launching operator is shown (the arrow leaves the operator at the kernel's start, or
    at the operator's end when the kernel started later: spans keep no launch time)."""
    host: dict[str, tuple[int, int, int]] = {}  # span id -> start, end, tid
    device: list[Any] = []
    ops = []
    for span in rank.spans():
        kind = span.attributes.get(sc.ATTR_OP_KIND)
        if kind is None or not inside(span.start_ns, span.end_ns):
            continue
        if kind == "cpu":
            ops.append(span)
        elif kind in DEVICE_KINDS:
            device.append(span)
    if not ops and not device:
        return []
    meta: list[dict[str, Any]] = []
    threads: dict[Any, _Lanes] = {}
    named: set[int] = set()
    ops.sort(key=lambda s: (s.start_ns, -s.end_ns))
    several = len({span.attributes.get(sc.ATTR_OP_THREAD, 0) for span in ops}) > 1
    for span in ops:
        thread = span.attributes.get(sc.ATTR_OP_THREAD, 0)
        if thread not in threads:
            threads[thread] = _Lanes()
        lane, shown = threads[thread].place(span.start_ns, span.end_ns)
        tid = TID_OPERATORS + 100 * list(threads).index(thread) + lane
        if tid not in named:
            named.add(tid)
            label = "operators" + (f" (thread {thread})" if several else "")
            label += f" ({lane + 1})" if lane else ""
            meta += _thread(pid, tid, label, 3 + tid - TID_OPERATORS)
        host[span.span_id] = (shown, span.end_ns, tid)
        events.append({"name": span.name, "cat": "operator", "ph": "X", "pid": pid, "tid": tid, "ts": ts(shown),
                       "dur": (span.end_ns - shown) / 1e3,
                       "args": {"step": span.attributes.get(sc.ATTR_STEP_NUMBER),
                                "category": span.attributes.get(sc.ATTR_OP_CATEGORY)}})
    streams: dict[int, _Lanes] = {}
    device.sort(key=lambda s: (s.start_ns, -s.end_ns))
    for span in device:
        gpu = int(span.attributes.get(sc.ATTR_KERNEL_DEVICE, 0) or 0)
        stream = int(span.attributes.get(sc.ATTR_KERNEL_STREAM, 0) or 0)
        base = TID_DEVICE + gpu * 1000 + stream % 1000
        lane, shown = streams.setdefault(base, _Lanes()).place(span.start_ns, span.end_ns)
        tid = base + 100_000 * lane
        if tid not in named:
            named.add(tid)
            meta += _thread(pid, tid, f"GPU {gpu} stream {stream}" + (f" ({lane + 1})" if lane else ""), tid)
        args: dict[str, Any] = {"kind": span.attributes.get(sc.ATTR_OP_KIND),
                                "category": span.attributes.get(sc.ATTR_OP_CATEGORY)}
        for key in (sc.ATTR_KERNEL_GRID, sc.ATTR_KERNEL_BLOCK, sc.ATTR_KERNEL_BYTES, sc.ATTR_KERNEL_CORRELATION):
            if key in span.attributes:
                args[key.rsplit(".", 1)[-1]] = span.attributes[key]
        events.append({"name": span.name, "cat": "gpu", "ph": "X", "pid": pid, "tid": tid, "ts": ts(shown),
                       "dur": (span.end_ns - shown) / 1e3, "args": args})
        launcher = host.get(span.parent_span_id)
        correlation = span.attributes.get(sc.ATTR_KERNEL_CORRELATION)
        if launcher is None or correlation is None:
            continue
        flow = flows.setdefault((pid, span.trace_id, int(correlation)), len(flows) + 1)
        at = min(max(span.start_ns, launcher[0]), launcher[1])
        events.append({"name": "launch", "cat": "launch", "ph": "s", "id": flow, "pid": pid, "tid": launcher[2],
                       "ts": ts(at)})
        events.append({"name": "launch", "cat": "launch", "ph": "f", "bp": "e", "id": flow, "pid": pid, "tid": tid,
                       "ts": ts(shown)})
    return meta


def _process(pid: int, name: str, sort: int) -> list[dict[str, Any]]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": sort}}]


def _thread(pid: int, tid: int, name: str, sort: int) -> list[dict[str, Any]]:
    return [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": sort}}]


def _counter(pid: int, name: str, at: float, values: dict[str, float]) -> dict[str, Any]:
    return {"name": name, "cat": "counter", "ph": "C", "pid": pid, "tid": 0, "ts": at, "args": values}


def _maybe(events: list[dict[str, Any]], pid: int, name: str, at: float, values: dict[str, float],
           scale: float) -> None:
    clean = {k: round(v * scale, 2) for k, v in values.items() if v == v and math.isfinite(v)}
    if clean:
        events.append(_counter(pid, name, at, clean))


def write_timeline(trace: dict[str, Any], path: str | Path) -> int:
    """Write the trace as strict JSON; returns the bytes written."""
    text = json.dumps(trace, separators=(",", ":"), allow_nan=False)
    Path(path).write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))
