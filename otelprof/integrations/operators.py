"""Operators and kernels of a profiling window, from the profiler's Kineto (Chrome) trace JSON.

:func:`parse_kineto_trace` is the one seam between ``torch.profiler``'s output and otelprof: it takes the
trace as ``export_chrome_trace`` writes it (``traceEvents`` with ``ph`` "X" complete events of category
``cpu_op`` / ``user_annotation`` on the host, ``cuda_runtime`` launches carrying ``args.correlation``, and
``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events on the device carrying the same ``correlation`` plus
``device``, ``stream``, ``grid``, ``block``, ``bytes``), so a CPU run here and a GPU run elsewhere go through
the same code. Host operators nest as they nest in time on their thread; a device event's parent is the
operator that enclosed its launch.

:func:`operator_spans` turns a parsed window into spans under the spans of the steps it covered, bounded
per step (``OTELPROF_PROFILE_MAX_SPANS``); :func:`window_summary` gives the bounded per-window statistics
behind the operator metrics, the report and ``profiles.jsonl``.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from otelprof import semconv as sc
from otelprof.runtime.metrics import MetricRegistry
from otelprof.runtime.span_builder import SpanBuilder, StepSpan
from otelprof.shared.collectives import covered, merged

HOST_CATEGORIES = ("cpu_op", "user_annotation")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


@dataclass
class Operator:
    """A host operator (``aten::*``, a ``record_function`` range): Unix ns, its thread and its parent's index."""

    name: str
    start_ns: int
    end_ns: int
    thread: int
    parent: int | None = None
    depth: int = 0
    self_ns: int = 0
    launches: int = 0


@dataclass
class DeviceOp:
    """A kernel, memcpy or memset on a GPU stream, and the index of the host operator that launched it."""

    name: str
    kind: str
    start_ns: int
    end_ns: int
    device: int
    stream: int
    correlation: int | None
    launcher: int | None = None
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    bytes: int | None = None
    launch_ns: int | None = None
    """When the host launched it (the ``cuda_runtime`` call's start): the start of a launch->kernel flow."""


@dataclass
class MemoryEvent:
    """An allocation (bytes > 0) or free (< 0) recorded with ``profile_memory``, after which the allocator of
    ``device`` ("cpu", "cuda:0") held ``allocated`` bytes; ``operator`` is the innermost operator it ran in."""

    t_ns: int
    bytes: int
    allocated: int
    reserved: int
    device: str
    operator: int | None


@dataclass
class ParsedTrace:
    operators: list[Operator] = field(default_factory=list)
    device: list[DeviceOp] = field(default_factory=list)
    memory: list[MemoryEvent] = field(default_factory=list)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _dims(value: Any) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(_int(v) for v in value[:3])
    return ()


def _args(event: Mapping[str, Any]) -> Mapping[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def parse_kineto_trace(trace: Mapping[str, Any], shift_ns: int = 0) -> ParsedTrace:
    """Host operators (nested) and device events (attached to their launching operator) of a Kineto trace.

    Timestamps become Unix ns: ``ts`` (µs) plus the trace's ``baseTimeNanoseconds`` when it has one, plus
    ``shift_ns`` (the caller's correction from the profiler's clock to its own). Malformed events are skipped.
    """
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ParsedTrace()
    collector = TraceCollector()
    for event in events:
        collector.add(event)
    return collector.finish(_int(trace.get("baseTimeNanoseconds")) + shift_ns)


class TraceCollector:
    """:func:`parse_kineto_trace` one event at a time, keeping at most ``max_events`` of them (host operators,
    launches, device and memory events; the rest are counted in ``dropped``), so that a trace read as a stream
    (:func:`read_trace_file`) is parsed in bounded memory. ``pause`` is called every :data:`CHUNK` events
    while nesting, to let other threads run."""

    def __init__(self, max_events: int = 0, pause: Callable[[], None] | None = None) -> None:
        self.max_events = max_events
        self.pause = pause
        self.kept = 0
        self.dropped = 0
        self._host: list[tuple[int, int, int, str, str, int | None]] = []  # start, end, thread, name, cat, corr
        self._device: list[tuple[dict[str, Any], int, int]] = []
        self._memory: list[tuple[int, int, Mapping[str, Any]]] = []

    def add(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        phase = event.get("ph")
        if phase in ("i", "I") and event.get("name") == MEMORY_EVENT:
            if self._full():
                return
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self._memory.append((round(float(event["ts"]) * 1000), _int(event.get("tid")), _args(event)))
                self.kept += 1
            return
        if phase != "X":
            return
        category = event.get("cat")
        host = category in HOST_CATEGORIES or category in LAUNCH_CATEGORIES
        if not host and category not in DEVICE_CATEGORIES:
            return
        try:
            start = round(float(event["ts"]) * 1000)
            end = start + max(round(float(event.get("dur", 0)) * 1000), 0)
        except (KeyError, TypeError, ValueError):
            return
        if self._full():
            return
        self.kept += 1
        if host:
            args = _args(event)
            correlation = _int(args.get("correlation"), -1) if category in LAUNCH_CATEGORIES else None
            self._host.append((start, end, _int(event.get("tid")), str(event.get("name", "")), str(category),
                               None if correlation == -1 else correlation))
        else:
            self._device.append((event, start, end))

    def _full(self) -> bool:
        if self.max_events and self.kept >= self.max_events:
            self.dropped += 1
            return True
        return False

    def _tick(self, index: int) -> None:
        if self.pause is not None and index % CHUNK == CHUNK - 1:
            self.pause()

    def finish(self, offset_ns: int = 0) -> ParsedTrace:
        """The parsed trace; ``offset_ns`` is added to every ``ts`` (the trace's base time and the clock shift)."""
        parsed = ParsedTrace()
        launches: dict[int, tuple[int | None, int]] = {}  # correlation -> (launching operator, launch time)
        # Nest per thread: sorted by start, longest first, an event's parent is the innermost open one enclosing it.
        host, self._host = self._host, []
        host.sort(key=lambda h: (h[2], h[0], -h[1]))
        stack: list[int] = []
        thread = None
        for index, (start, end, tid, name, category, correlation) in enumerate(host):
            self._tick(index)
            start, end = start + offset_ns, end + offset_ns
            if tid != thread:
                thread, stack = tid, []
            while stack and parsed.operators[stack[-1]].end_ns < end:
                stack.pop()  # ended before this one, or overlaps it without enclosing it: not a parent
            parent = stack[-1] if stack else None
            if category in LAUNCH_CATEGORIES:
                if correlation is not None:
                    launches[correlation] = (parent, start)
                if parent is not None:
                    parsed.operators[parent].launches += 1
                continue
            depth = parsed.operators[parent].depth + 1 if parent is not None else 0
            parsed.operators.append(Operator(name, start, end, tid, parent, depth))
            stack.append(len(parsed.operators) - 1)
        del host
        for op in parsed.operators:
            op.self_ns = op.end_ns - op.start_ns
        for op in parsed.operators:
            if op.parent is not None:
                parsed.operators[op.parent].self_ns -= op.end_ns - op.start_ns
        device, self._device = self._device, []
        for index, (event, start, end) in enumerate(device):
            self._tick(index)
            args = _args(event)
            correlation = _int(args.get("correlation"), -1)
            launcher, launch_ns = launches.get(correlation, (None, None))
            raw_bytes = args.get("bytes")
            parsed.device.append(DeviceOp(
                str(event.get("name", "")), DEVICE_CATEGORIES[str(event.get("cat"))], start + offset_ns,
                end + offset_ns, _int(args.get("device"), _int(event.get("pid"))),
                _int(args.get("stream"), _int(event.get("tid"))), None if correlation == -1 else correlation,
                launcher, _dims(args.get("grid")), _dims(args.get("block")),
                _int(raw_bytes) if raw_bytes is not None else None, launch_ns))
        parsed.device.sort(key=lambda d: d.start_ns)
        memory, self._memory = self._memory, []
        parsed.memory = _memory_events(parsed.operators, [(t + offset_ns, tid, args) for t, tid, args in memory])
        return parsed


CHUNK = 2000
"""Events handled between two pauses of a paced parse."""
READ_BYTES = 1 << 20
"""Bytes of a trace file read at a time by :func:`read_trace_file`."""


def read_trace_file(path: str, header: dict[str, Any]) -> Iterator[Any]:
    """The ``traceEvents`` of a Kineto (Chrome) trace file one at a time, reading :data:`READ_BYTES` at a time
    (``json.load`` of a whole trace takes about three times its size in memory). The file's other top-level
    members go into ``header`` as they are read (Kineto writes ``baseTimeNanoseconds`` before or after the
    events, depending on its version): complete once the iterator is exhausted. Raises ``ValueError`` on a
    file that is not a JSON object."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buffer = ""
        position = 0

        def fill() -> bool:
            nonlocal buffer, position
            chunk = f.read(READ_BYTES)
            buffer = buffer[position:] + chunk
            position = 0
            return bool(chunk)

        def skip(chars: str) -> str:
            """Skip whitespace and ``chars``; the next character ('' at the end of the file)."""
            nonlocal position
            while True:
                while position < len(buffer) and (buffer[position].isspace() or buffer[position] in chars):
                    position += 1
                if position < len(buffer):
                    return buffer[position]
                if not fill():
                    return ""

        def value() -> Any:
            nonlocal position
            while True:
                try:
                    item, end = decoder.raw_decode(buffer, position)
                except ValueError:
                    if fill():
                        continue
                    raise
                if end == len(buffer) and fill():  # a number may go on in the next chunk
                    continue
                position = end
                return item

        if skip("") != "{":
            raise ValueError("not a JSON object")
        position += 1
        while True:
            if skip(",") == "}":
                return
            key = value()
            if not isinstance(key, str) or skip("") != ":":
                raise ValueError("not a JSON object")
            position += 1
            if skip("") != "[" or key != "traceEvents":
                header[key] = value()
                continue
            position += 1
            while skip(",") not in ("]", ""):
                yield value()
            position += 1


MEMORY_EVENT = "[memory]"
"""Name of the profiler's allocation instant events (``profile_memory=True``)."""


def _memory_events(operators: Sequence[Operator], raw: list[tuple[int, int, Mapping[str, Any]]]
                   ) -> list[MemoryEvent]:
    """Memory events in time order, each attributed to the innermost operator of its thread around it: the last
    operator started before it, or the nearest of that one's ancestors still running."""
    starts: dict[int, tuple[list[int], list[int]]] = {}  # thread -> (start times, operator indices), by start
    for index in sorted(range(len(operators)), key=lambda i: operators[i].start_ns):
        op = operators[index]
        times, indices = starts.setdefault(op.thread, ([], []))
        times.append(op.start_ns)
        indices.append(index)
    out = []
    for t_ns, tid, args in sorted(raw, key=lambda r: r[0]):
        operator = None
        if tid in starts:
            times, indices = starts[tid]
            at = bisect.bisect_right(times, t_ns) - 1
            candidate: int | None = indices[at] if at >= 0 else None
            while candidate is not None and operators[candidate].end_ns < t_ns:
                candidate = operators[candidate].parent
            operator = candidate
        kind = _int(args.get("Device Type"))
        device = "cpu" if kind == 0 else f"cuda:{_int(args.get('Device Id'))}" if kind == 1 else f"device{kind}"
        out.append(MemoryEvent(t_ns, _int(args.get("Bytes")), _int(args.get("Total Allocated")),
                               _int(args.get("Total Reserved")), device, operator))
    return out


# ---------------------------------------------------------------- categories
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"nccl|c10d|all_?reduce|all_?gather|reduce_?scatter|broadcast|all_to_all|"
                                 r"send|recv|gloo", re.I)),
    ("memory_copy", re.compile(r"memcpy|memset|copy_|::to$|::_to_copy|contiguous|clone|pin_memory", re.I)),
    ("attention", re.compile(r"attention|flash|sdpa|fmha|softmax", re.I)),
    ("convolution", re.compile(r"conv|cudnn.*(fprop|dgrad|wgrad)|implicit_gemm|winograd", re.I)),
    ("matmul", re.compile(r"matmul|\bmm\b|::mm$|::bmm|addmm|linear|gemm|cutlass|dot|einsum|baddbmm", re.I)),
    ("normalization", re.compile(r"norm|batch_norm|layer_norm|group_norm|rms", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|::(add|sub|mul|div|relu|gelu|silu|sigmoid|tanh|exp|"
                               r"pow|sqrt|rsqrt|neg|abs|clamp|threshold|where|fill|zero|dropout|max_pool|"
                               r"avg_pool|pool|sum|mean|max|min|_foreach|add_|mul_|lerp|sign|log)", re.I)),
)
"""Operator categories by name pattern, first match wins (documented in docs/pytorch.md); else ``other``."""


def categorize(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


# ---------------------------------------------------------------- spans
def _step_of(start_ns: int, steps: Sequence[StepSpan]) -> StepSpan | None:
    for step in steps:
        if step.start_ns <= start_ns < step.end_ns:
            return step
    return None


def operator_spans(builder: SpanBuilder, parsed: ParsedTrace, steps: Sequence[StepSpan],
                   max_per_step: int) -> tuple[list[ReadableSpan], int]:
    """Spans for the operators and device events of ``parsed`` under the step spans ``steps``.

    A top-level operator belongs to the step its start falls in (operators between steps are left out); its
    descendants and the device events it launched follow it. Per step at most ``max_per_step`` host operators
    are kept, the longest first (a parent is never shorter than its child, so the kept set is closed upwards),
    and at most as many device events, the longest first among those whose launcher was kept. Returns the
    spans and how many operators and device events were left out."""
    ops = parsed.operators
    owner: list[StepSpan | None] = [None] * len(ops)
    for index, op in enumerate(ops):
        owner[index] = _step_of(op.start_ns, steps) if op.parent is None else owner[op.parent]
    dropped = 0
    kept: set[int] = set()
    by_step: dict[int, list[int]] = {}
    for index, step in enumerate(owner):
        if step is None:
            dropped += 1
        else:
            by_step.setdefault(step.number, []).append(index)
    for indices in by_step.values():
        indices.sort(key=lambda i: (-(ops[i].end_ns - ops[i].start_ns), ops[i].depth))
        kept.update(indices[:max_per_step])
        dropped += max(len(indices) - max_per_step, 0)
    contexts: dict[int, SpanContext] = {}
    spans: list[ReadableSpan] = []
    for index in sorted(kept, key=lambda i: ops[i].depth):  # parents before children
        op = ops[index]
        step = owner[index]
        assert step is not None
        parent = contexts[op.parent] if op.parent is not None else step.context
        context = contexts[index] = builder.child_context(parent)
        spans.append(builder.span(op.name, context, parent, op.start_ns, op.end_ns, {
            sc.ATTR_OP_KIND: "cpu", sc.ATTR_OP_THREAD: op.thread, sc.ATTR_OP_CATEGORY: categorize(op.name),
            sc.ATTR_STEP_NUMBER: step.number}))
    device_by_step: dict[int, list[DeviceOp]] = {}
    for event in parsed.device:
        if event.launcher is None or event.launcher not in kept:
            dropped += 1
            continue
        owner_step = owner[event.launcher]
        assert owner_step is not None
        device_by_step.setdefault(owner_step.number, []).append(event)
    for events in device_by_step.values():
        events.sort(key=lambda d: d.start_ns - d.end_ns)
        dropped += max(len(events) - max_per_step, 0)
        for event in events[:max_per_step]:
            assert event.launcher is not None
            parent = contexts[event.launcher]
            attributes: dict[str, Any] = {sc.ATTR_OP_KIND: event.kind, sc.ATTR_KERNEL_DEVICE: event.device,
                                          sc.ATTR_KERNEL_STREAM: event.stream,
                                          sc.ATTR_OP_CATEGORY: categorize(event.name)}
            if event.correlation is not None:
                attributes[sc.ATTR_KERNEL_CORRELATION] = event.correlation
            if event.grid:
                attributes[sc.ATTR_KERNEL_GRID] = list(event.grid)
            if event.block:
                attributes[sc.ATTR_KERNEL_BLOCK] = list(event.block)
            if event.bytes is not None:
                attributes[sc.ATTR_KERNEL_BYTES] = event.bytes
            spans.append(builder.span(event.name, builder.child_context(parent), parent, event.start_ns,
                                      event.end_ns, attributes))
    return spans, dropped


# ---------------------------------------------------------------- per-window statistics
def _top(table: dict[str, list[float]], top: int) -> list[dict[str, Any]]:
    """Rows sorted by self time, the ``top`` first, the rest summed into one ``other`` row."""
    rows = sorted(table.items(), key=lambda kv: -kv[1][0])
    out = [{"name": name, "self_s": v[0], "total_s": v[1], "calls": int(v[2]), "launches": int(v[3])}
           for name, v in rows[:top]]
    rest = rows[top:]
    if rest:
        out.append({"name": sc.OTHER_LABEL_VALUE, "self_s": sum(v[0] for _, v in rest),
                    "total_s": sum(v[1] for _, v in rest), "calls": int(sum(v[2] for _, v in rest)),
                    "launches": int(sum(v[3] for _, v in rest))})
    return out


def host_table(parsed: ParsedTrace) -> dict[str, list[float]]:
    """Per host operator name: [self s, total s (a recursive call counted once), calls, launches]."""
    host: dict[str, list[float]] = {}
    for op in parsed.operators:
        row = host.setdefault(op.name, [0.0, 0.0, 0.0, 0.0])
        row[0] += op.self_ns / 1e9
        if not _inside_same(parsed.operators, op):
            row[1] += (op.end_ns - op.start_ns) / 1e9
        row[2] += 1
        row[3] += op.launches
    return host


def device_table(parsed: ParsedTrace) -> dict[str, list[float]]:
    """Per kernel, memcpy or memset name: [time s, time s, calls, calls] (the rows of :func:`host_table`)."""
    kernels: dict[str, list[float]] = {}
    for event in parsed.device:
        seconds = (event.end_ns - event.start_ns) / 1e9
        row = kernels.setdefault(event.name, [0.0, 0.0, 0.0, 0.0])
        row[0] += seconds
        row[1] += seconds
        row[2] += 1
        row[3] += 1
    return kernels


def window_summary(parsed: ParsedTrace, top: int, precision: Any = None) -> dict[str, Any]:
    """Top operators and kernels (the rest as ``other``), time per category, host vs device operator time
    and the kernel precision mix of one window. ``total_s`` of an operator counts a recursive call once."""
    categories: dict[str, float] = {}
    precisions: dict[str, float] = {}
    device_s = 0.0
    kinds: dict[str, float] = {}
    for event in parsed.device:
        seconds = (event.end_ns - event.start_ns) / 1e9
        device_s += seconds
        kinds[event.kind] = kinds.get(event.kind, 0.0) + seconds
        category = categorize(event.name) if event.kind == "kernel" else "memory_copy"
        categories[category] = categories.get(category, 0.0) + seconds
        if event.kind == "kernel" and precision is not None:
            label = precision(event.name)
            precisions[label] = precisions.get(label, 0.0) + seconds
    host_s = 0.0
    host_categories: dict[str, float] = {}
    for op in parsed.operators:
        seconds = op.self_ns / 1e9
        host_s += seconds
        label = categorize(op.name)
        host_categories[label] = host_categories.get(label, 0.0) + seconds
    return {
        "overlap": overlap_summary(parsed),
        "memory": memory_summary(parsed, top),
        "ops": _top(host_table(parsed), top),
        "kernels": _top(device_table(parsed), top),
        "host_op_s": host_s,
        "device_op_s": device_s,
        "categories_s": {"cpu": host_categories, "gpu": categories},
        "kernel_precision_s": precisions,
        "device_kinds_s": kinds,
        "operators": len(parsed.operators),
        "device_events": len(parsed.device),
    }


def overlap_summary(parsed: ParsedTrace) -> dict[str, float]:
    """Communication/computation overlap on the device timeline of a window, over all its GPUs: the time some
    collective kernel (category communication: NCCL) ran, how much of it some compute kernel (any other kernel)
    ran at the same time on the same GPU, and the rest, exposed (the GPU only communicated). Empty without
    collective kernels."""
    comm: dict[int, list[tuple[int, int]]] = {}
    compute: dict[int, list[tuple[int, int]]] = {}
    for event in parsed.device:
        if event.kind != "kernel":
            continue
        side = comm if categorize(event.name) == "communication" else compute
        side.setdefault(event.device, []).append((event.start_ns, event.end_ns))
    if not comm:
        return {}
    comm_ns = overlapped_ns = compute_ns = 0
    for device in comm.keys() | compute.keys():
        collectives, kernels = merged(comm.get(device, [])), merged(compute.get(device, []))
        comm_ns += sum(e - s for s, e in collectives)
        compute_ns += sum(e - s for s, e in kernels)
        overlapped_ns += covered(collectives, kernels)
    return {"communication_s": comm_ns / 1e9, "overlapped_s": overlapped_ns / 1e9,
            "exposed_s": (comm_ns - overlapped_ns) / 1e9, "compute_s": compute_ns / 1e9,
            "overlap_ratio": overlapped_ns / comm_ns if comm_ns else 0.0}


CURVE_POINTS = 200
"""Points kept of a window's memory curve per device (the largest of each time bucket)."""


def memory_summary(parsed: ParsedTrace, top: int) -> dict[str, Any]:
    """Per window: the operators that allocated the most (bytes and allocations, their own allocations only, the
    rest as ``other``), per device the peak allocated and reserved bytes, and the allocated-bytes curve (Unix
    ns, bytes; at most CURVE_POINTS points, each the largest of its time bucket)."""
    if not parsed.memory:
        return {}
    allocs: dict[tuple[str, str], list[int]] = {}
    peaks: dict[str, list[int]] = {}
    points: dict[str, list[tuple[int, int]]] = {}
    for event in parsed.memory:
        points.setdefault(event.device, []).append((event.t_ns, event.allocated))
        peak = peaks.setdefault(event.device, [0, 0])
        peak[0] = max(peak[0], event.allocated)
        peak[1] = max(peak[1], event.reserved)
        if event.bytes > 0:
            name = parsed.operators[event.operator].name if event.operator is not None else "(outside operators)"
            row = allocs.setdefault((event.device, name), [0, 0])
            row[0] += event.bytes
            row[1] += 1
    ranked = sorted(allocs.items(), key=lambda kv: -kv[1][0])
    rows = [{"device": device, "name": name, "bytes": v[0], "allocations": v[1]} for (device, name), v in ranked[:top]]
    rest = ranked[top:]
    if rest:
        rows.append({"device": rest[0][0][0], "name": sc.OTHER_LABEL_VALUE, "bytes": sum(v[0] for _, v in rest),
                     "allocations": sum(v[1] for _, v in rest)})
    return {"top": rows, "peak_bytes": {d: p[0] for d, p in peaks.items()},
            "reserved_bytes": {d: p[1] for d, p in peaks.items()},
            "curve": {d: _downsample(p, CURVE_POINTS) for d, p in points.items()}}


def _downsample(points: list[tuple[int, int]], limit: int) -> list[list[int]]:
    if len(points) <= limit:
        return [list(p) for p in points]
    first, last = points[0][0], points[-1][0]
    width = (last - first) / limit or 1
    buckets: dict[int, tuple[int, int]] = {}
    for t, value in points:
        key = min(int((t - first) / width), limit - 1)
        if key not in buckets or value > buckets[key][1]:
            buckets[key] = (t, value)
    return [list(buckets[k]) for k in sorted(buckets)]


def _inside_same(ops: Sequence[Operator], op: Operator) -> bool:
    parent = op.parent
    while parent is not None:
        if ops[parent].name == op.name:
            return True
        parent = ops[parent].parent
    return False


NAME_LIMIT = 120
"""Characters of an operator or kernel name kept in a metric label (C++ kernel names run to kilobytes)."""


def _kind(device: str) -> str:
    return "cpu" if device == "cpu" else "gpu"


def set_metrics(registry: MetricRegistry, stats: Mapping[str, Any], num_steps: int) -> None:
    """The last window's operator gauges, per profiled step; the previous window's series are replaced, so
    at most ``2 * (top + 1)`` operator series, 16 category series and 8 precision series exist at a time."""
    per_step = 1.0 / max(num_steps, 1)
    with registry.lock:
        self_time = registry.gauge(sc.OPERATOR_SELF_TIME)
        total_time = registry.gauge(sc.OPERATOR_TOTAL_TIME)
        calls = registry.gauge(sc.OPERATOR_CALLS)
        launches = registry.gauge(sc.OPERATOR_LAUNCHES)
        categories = registry.gauge(sc.OPERATOR_CATEGORY_TIME)
        precision = registry.gauge(sc.KERNEL_PRECISION)
        for gauge in (self_time, total_time, calls, launches, categories, precision):
            gauge.values.clear()
        for device, rows in (("cpu", stats["ops"]), ("gpu", stats["kernels"])):
            for row in rows:
                labels = (device, str(row["name"])[:NAME_LIMIT])
                self_time.set(row["self_s"] * per_step, labels)
                total_time.set(row["total_s"] * per_step, labels)
                calls.set(row["calls"] * per_step, labels)
                if device == "cpu" and row["launches"]:
                    launches.set(row["launches"] * per_step, labels[1:])
        for device, table in stats["categories_s"].items():
            for category, seconds in table.items():
                categories.set(seconds * per_step, (device, category))
        busy = stats["host_op_s"] + stats["device_op_s"]
        if busy > 0:
            registry.gauge(sc.OPERATOR_HOST_RATIO).set(stats["host_op_s"] / busy)
        allocated = registry.gauge(sc.OPERATOR_ALLOCATED)
        peak = registry.gauge(sc.PROFILE_MEMORY_PEAK)
        allocated.values.clear()
        peak.values.clear()
        memory = stats.get("memory") or {}
        for row in memory.get("top", ()):
            labels = (_kind(row["device"]), str(row["name"])[:NAME_LIMIT])
            allocated.set(allocated.values.get(labels, 0.0) + row["bytes"] * per_step, labels)
        for device, value in (memory.get("peak_bytes") or {}).items():
            kind = (_kind(device),)
            peak.set(max(peak.values.get(kind, 0.0), value), kind)
        overlap = stats.get("overlap") or {}
        ratio, exposed = registry.gauge(sc.COMM_OVERLAP), registry.gauge(sc.COMM_EXPOSED)
        ratio.values.clear()
        exposed.values.clear()
        if overlap:
            ratio.set(overlap["overlap_ratio"])
            exposed.set(overlap["exposed_s"] * per_step)
        kernel_s = sum(stats["kernel_precision_s"].values())
        for label, seconds in stats["kernel_precision_s"].items():
            if kernel_s > 0:
                precision.set(seconds / kernel_s, (label,))
