"""Operator-profiling windows: ``torch.profiler`` for a few chosen steps, never for every step.

A window starts as step ``start_step`` begins and stops as its ``num_steps``-th step ends.
Its result — top CPU and GPU operators (calls, self and total time), on CUDA the kernel precision
mix and the GPU activity mix (kernel / memcpy / memset / sync) — goes to the recording
(``profiles.jsonl``) and out as one ``otelprof.profile`` span whose events are the top operators;
optionally the full Chrome trace is kept next to the recording. The summary is computed on a
background thread so the training thread only pays for starting and stopping the profiler.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import Event

from otelprof import _warnings
from otelprof import semconv as sc
from otelprof._log import info_once, logger, warn_once
from otelprof.integrations import operators, window_bounds
from otelprof.integrations.profile_summary import kernel_precision, summarize_parsed
from otelprof.recording import schema
from otelprof.runtime import extensions
from otelprof.runtime import hotpath as hot
from otelprof.runtime.span_builder import SpanBuilder

DEFAULT_MAX_EVENTS = 100_000
"""Events per window when no session configured one (OTELPROF_PROFILE_MAX_EVENTS)."""


@dataclass
class _Window:
    start_step: int
    num_steps: int
    chrome_trace: bool
    top: int
    trigger: str = "api"
    phase: str | None = None
    """Only steps of this phase open and count the window (None: the current phase at each step)."""
    on_finished: Callable[[float], None] | None = None
    """Called from the processing thread once the window is summarized, with its measured overhead in s."""
    profiler: Any = None
    thread: int = 0
    """``threading.get_ident()`` of the thread that started the profiler: torch.profiler's callbacks are that
    thread's, and only that thread can stop it (stopped elsewhere, they stay; the process crashes at exit)."""
    started_ns: int = 0
    shift_ns: int = 0
    """Recorder clock (perf counter + its offset) minus the profiler's (wall clock) at the start."""
    begins: deque[int] = field(default_factory=lambda: deque(maxlen=BASELINE_STEPS + 1))
    """perf_counter_ns at the start of the steps before the window (its baseline) and of its first step."""
    after_ns: int = 0
    """perf_counter_ns when the step after the window began (0: not yet)."""
    measured: threading.Event = field(default_factory=threading.Event)
    step_overhead_s: float = 0.0
    counter: Any = None
    """The FLOP counter of the step after the window (flops.py), while it counts."""
    counter_thread: int = 0
    """The thread whose dispatch-mode stack holds the counter (the only one that can pop it)."""
    counted: threading.Event = field(default_factory=threading.Event)
    flop_count: dict[str, Any] | None = None
    flop_step_ns: int = 0
    """Duration of the counted step (with the counter's cost)."""
    until_step: int = 0
    """A window asked for steps start_step .. until_step - 1 (set as it starts): one planned or stopped shorter
    leaves the rest to the next segment, from the step after it was summarised (not a periodic window)."""
    segment: int = 0
    """0 for a window as armed; 1, 2, ... for the windows that go on with its remaining steps."""
    baseline_ns: float = 0.0
    """Mean period of the steps before the window (a later segment keeps the first one's)."""
    watch: window_bounds.HeapWatch | None = None
    steps_profiled: int = 0
    """Steps that ran (wholly or partly) under the profiler."""
    whole_steps: int = 0
    """Steps that ran wholly under the profiler (one fewer than steps_profiled when it stopped mid-step)."""
    truncated: str | None = None
    """Why the window stopped before its planned steps: ``events`` (the event cap)."""
    count_flops: bool = True
    max_events: int = DEFAULT_MAX_EVENTS
    epoch: int = 0
    """The session count of :class:`ProfileWindows` as the window started."""


UNKNOWN_FREE_WARNING = 1000
"""With ``profile_memory``, PyTorch's CPU allocator logs "Memory block of unknown size was allocated before the
profiling started" to stderr at the first and then every 1000th free of a block allocated before a profiler
started (a c10 LOG(WARNING), which no Python setting silences). The first window frees one such block while
stderr is muted, so the first line, which every run would print, is not the job's; a later one comes only
after 1000 such frees inside windows (tens per window: hours of a default schedule). OTELPROF_PROFILE_MEMORY=false
avoids them altogether."""

BASELINE_STEPS = 3
"""Steps just before a window whose mean period is the window's baseline (a periodic window is armed that
many steps ahead)."""
AFTER_STEP_WAIT = 10.0
"""Seconds the processing thread waits for the step after the window (to measure the window's overhead), or
twice the baseline step when that is longer."""
CLOSE_WAIT = 5.0
"""Longest wait, as the session shuts down, for windows being summarized (within its shutdown timeout)."""
PROCESS_SHARE = 0.25
"""Most of the wall-clock time the processing thread runs while it summarises a window: it sleeps three times
as long as it ran after each chunk of events (operators.CHUNK), so the training thread keeps the interpreter
at least three quarters of the time."""


def _max_events() -> int:
    from otelprof.runtime.session import get_session

    session = get_session()
    return int(getattr(getattr(session, "config", None), "profile_max_events", DEFAULT_MAX_EVENTS))


class ProfileWindows:
    """Arms and runs windows: started as a step begins, stopped as the window's last step ends (or, past the
    event cap, at the module call where the cap was reached), both on the training thread.

    torch.profiler and the FLOP counter belong to the thread that started them (thread-local RecordFunction
    callbacks, the thread's dispatch-mode stack): each is stopped on that thread only — at the window's end or
    where its watch saw the cap reached, when the session closes there, when that thread ends, or at exit (the
    main thread's). A profiler left running at exit makes the process crash in torch's teardown ("Requested
    callback is not found", then SIGSEGV)."""

    baseline_steps = BASELINE_STEPS
    close_wait = CLOSE_WAIT

    def __init__(self) -> None:
        self._pending: list[_Window] = []
        self._running: _Window | None = None
        self._after: _Window | None = None
        self._counting: _Window | None = None
        self._orphans: list[_Window] = []
        """Windows (profiling or counting) the session dropped that only their own thread can stop."""
        self._threads: list[threading.Thread] = []
        """Summarizing threads, joined (bounded) when the session closes."""
        self._exit_hook = False
        self._processing = 0
        self._epoch = 0
        """Sessions closed so far: a window summarised after its session closed starts no further segment."""
        self._lock = threading.Lock()
        self.costs = window_bounds.EventCosts()
        self._step_heap = window_bounds.StepHeap()
        self._hook: Any = None
        """The global module forward pre-hook that watches a window's heap (installed on the training thread).
        Once torch.compile has compiled a frame it stays until the session closes, and is never first installed
        then: Dynamo guards on the number of global hooks (a change recompiles every compiled frame)."""
        self._watching = False
        """The hook is a checkpoint (the steps before a window and the window's): off, it returns at once."""
        self._thread = 0
        """That thread's id: module calls on other threads are no checkpoints."""
        self._compiling: Callable[[], bool] = lambda: False

    @property
    def busy(self) -> bool:
        """A window is armed, running, not yet measured or still being summarised."""
        return (bool(self._pending) or self._running is not None or self._after is not None
                or self._processing > 0)

    def reset(self) -> None:
        """A new session (the hot path's callbacks were cleared, and its steps may be another loop's): forget armed
        windows and what earlier windows measured, stop what is left."""
        self.close(0.0)
        with self._lock:
            self.costs = window_bounds.EventCosts()
            self._step_heap = window_bounds.StepHeap()
            if not self._exit_hook:  # after the session's own shutdown at exit (atexit runs the last first)
                self._exit_hook = True
                atexit.register(self.release_thread)

    def close(self, timeout: float) -> None:
        """The session ends: armed windows are forgotten; a running profiler or FLOP counter is stopped here when
        this thread started it (the window is dropped), else by its own thread (:meth:`release_thread`); windows
        being summarized get ``timeout`` seconds to finish (no step after them is coming)."""
        with self._lock:
            self.costs = window_bounds.EventCosts()
            self._step_heap = window_bounds.StepHeap()
            self._pending.clear()
            self._epoch += 1
            running, self._running = self._running, None
            after, self._after = self._after, None
            counting, self._counting = self._counting, None
            while self._on_begin in hot._step_begin:
                hot._step_begin.remove(self._on_begin)
            for callback in (self._on_end, self._on_counted):
                while callback in hot._step_boundary:
                    hot._step_boundary.remove(callback)
            self._orphans += [window for window in (running, counting) if window is not None]
            threads, self._threads = self._threads, []
            self._remove_hook(closing=True)
        for window in (after, counting):
            if window is not None:  # its summary goes on without the step after it (or its FLOP count)
                window.measured.set()
                window.counted.set()
        self.release_thread()
        deadline = time.monotonic() + max(timeout, 0.0)
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        if self._orphans:
            info_once("profile:orphan", "otelprof: the session closed while a profiling window ran on another "
                      "thread; it stops when that thread ends")

    def release_thread(self) -> None:
        """Stop the profiler and the FLOP counter this thread started, dropping their windows: when the session
        closes, when the thread ends and, for the main thread, at exit."""
        me = threading.get_ident()
        with self._lock:
            for window in (self._running, self._counting):
                if window is not None and me in (window.thread, window.counter_thread):
                    self._orphans.append(window)
            if self._running is not None and self._running.thread == me:
                self._running = None
            if self._counting is not None and self._counting.counter_thread == me:
                self._counting = None
            mine = [w for w in self._orphans if w.thread == me or (w.counter is not None and w.counter_thread == me)]
            self._orphans = [w for w in self._orphans if not any(w is m for m in mine)]
        for window in mine:
            if window.counter is not None and window.counter_thread == me:
                self._stop_count(window, 0)
            if window.thread == me:
                _stop_profiler(window)

    def arm(self, start_step: int, num_steps: int, *, chrome_trace: bool = False, top: int = 15,
            trigger: str = "api", phase: str | None = None,
            on_finished: Callable[[float], None] | None = None) -> dict[str, Any]:
        if num_steps < 1 or start_step < 0:
            raise ValueError("profile windows need start_step >= 0 and num_steps >= 1")
        window = _Window(start_step, num_steps, chrome_trace, top, trigger, phase, on_finished)
        self._add(window)
        max_events = _max_events()
        per_step = self.costs.events_per_step.get(phase or hot.current_phase())
        return {"armed": True, "kind": "torch.profiler", "start_step": start_step, "num_steps": num_steps,
                "max_events": max_events,
                "steps_per_window": self.costs.plan(num_steps, phase or hot.current_phase(), max_events)
                if per_step else None}

    def _add(self, window: _Window) -> None:
        with self._lock:
            self._pending.append(window)
            self._pending.sort(key=lambda w: w.start_step)
            if self._on_begin not in hot._step_begin:
                hot._step_begin.append(self._on_begin)

    # ------------------------------------------------------------------ the heap watch
    def _install_hook(self) -> None:
        """On the training thread: module calls become checkpoints of the heap watch."""
        from otelprof.integrations import torch_compile

        self._thread = threading.get_ident()
        self._watching = True
        # after a compile a new global hook would change a Dynamo guard (and compiled module calls run no hooks)
        if self._hook is None and not torch_compile.has_compiled():
            import torch
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._compiling = torch.compiler.is_compiling
            torch_compile.quiet_global_hooks()  # torch's warning at compiled modules' calls: not the job's
            torch_compile.run_eagerly(self._checkpoint)  # never compiled on its own (then it would do nothing)
            self._hook = register_module_forward_pre_hook(self._checkpoint)

    def _remove_hook(self, *, closing: bool = False) -> None:
        """The window's checkpoints end; the hook itself goes now unless torch.compile compiled a frame meanwhile
        (then when the session closes: ``closing``)."""
        from otelprof.integrations import torch_compile

        self._watching = False
        if self._hook is not None and (closing or not torch_compile.has_compiled()):
            self._hook.remove()  # safe inside a hook: Module calls iterate over a copy
            self._hook = None
            torch_compile.unquiet_global_hooks()

    def _checkpoint(self, module: Any, args: Any) -> None:
        """Global forward pre-hook: the step's own heap growth before a window; in a window, past the event
        cap, the window stops here."""
        try:
            # inside torch.compile's tracing first, before anything Dynamo cannot trace (threading.get_ident):
            # nothing to do there, and a compiled module's calls run no hooks anyway
            if self._compiling() or not self._watching:
                return
            # the profiler stops on its own thread only
            if threading.get_ident() != self._thread:
                return
            window = self._running
            if window is None:
                self._step_heap.checkpoint()
                return
            watch = window.watch
            if watch is None or window.thread != threading.get_ident() or watch.events() < window.max_events:
                return
            with self._lock:
                if self._running is window:
                    self._stop(window, "events", mid_step=True)
        except Exception as exc:  # never into the model's forward
            warn_once("profile:watch", "otelprof: the profiling window watch failed (%s); it is off", exc)
            self._remove_hook(closing=True)

    # ------------------------------------------------------------------ step callbacks
    def _on_begin(self, step: hot.StepContext) -> None:
        now = time.perf_counter_ns()
        if hot._active is None:  # no session (a window armed as it closed): no profiler to start
            return
        with self._lock:
            counting = self._counting
            if counting is not None and counting.counter_thread == threading.get_ident():
                self._stop_count(counting, 0)  # the counted step raised: its boundary never came
            after = self._after
            if after is not None and step.phase == (after.phase or step.phase):
                after.after_ns = now
                self._after = None
                after.measured.set()
                self._start_count(after)
                if not self._pending and self._counting is None:
                    hot._step_begin.remove(self._on_begin)
            if self._running is not None or not self._pending:
                return
            window = self._pending[0]
            if window.phase is not None and step.phase != window.phase:
                return
            window.begins.append(now)
            if step.number + BASELINE_STEPS >= window.start_step:
                self._install_hook()
                self._step_heap.step_began()
            if step.number < window.start_step:
                return
            self._pending.pop(0)
            window.start_step = step.number
            window.phase = step.phase
            if not self._pending and self._after is None:
                hot._step_begin.remove(self._on_begin)
            window.max_events = _max_events()
            if not window.until_step:
                window.until_step = step.number + window.num_steps
            window.num_steps = self.costs.plan(window.num_steps, step.phase, window.max_events)
            if not window.baseline_ns:
                window.baseline_ns = _baseline_ns(window)
            if self._start(window):
                hot._step_boundary.append(self._on_end)
            elif not self._pending:
                self._remove_hook()

    def _on_end(self) -> None:
        with self._lock:
            window = self._running
            if window is None:
                return
            if window.thread != threading.get_ident():  # the profiler is stopped on its own thread
                hot._step_boundary.append(self._on_end)
                return
            done = hot.next_step_number(window.phase) - window.start_step
            if done >= window.num_steps:
                self._stop(window, None, mid_step=False)
            elif window.watch is not None and window.watch.events(force=True) >= window.max_events:
                self._stop(window, "events", mid_step=False)
            else:
                hot._step_boundary.append(self._on_end)

    def _stop(self, window: _Window, truncated: str | None, *, mid_step: bool) -> None:
        """End a running window (lock held, training thread): at its last step's end, or early."""
        # the step under way counts (mid-step); at least one step ran under the profiler whatever the numbering
        done = max(hot.next_step_number(window.phase) - window.start_step, 1)
        window.steps_profiled = done
        window.whole_steps = done - 1 if mid_step else done
        window.truncated = truncated
        if mid_step:  # a step past the event cap: counting its FLOPs would cost as much again, in Python
            window.count_flops = False
        if window.watch is not None:
            window.watch.events(force=True)
        self._running = None
        self._after = window  # the next step's start closes the window's measurement
        if self._on_begin not in hot._step_begin:
            hot._step_begin.append(self._on_begin)
        if not self._pending:
            self._remove_hook()
        self._finish(window)

    def _start_count(self, window: _Window) -> None:
        """Count the FLOPs of this step (the one after the window) until its end."""
        from otelprof.integrations import flops
        from otelprof.runtime.session import get_session

        session = get_session()
        if session is not None and session.config.profile_flops and window.count_flops:
            window.counter = flops.start()
        if window.counter is None:
            window.counted.set()
            return
        window.counter_thread = threading.get_ident()
        _watch_thread_end()
        self._counting = window
        hot._step_boundary.append(self._on_counted)

    def _on_counted(self) -> None:
        with self._lock:
            window = self._counting
            if window is None:
                return
            if window.counter_thread != threading.get_ident():  # popped from its own thread's mode stack only
                hot._step_boundary.append(self._on_counted)
                return
            self._stop_count(window, time.perf_counter_ns() - window.after_ns)
            if not self._pending and self._after is None and self._on_begin in hot._step_begin:
                hot._step_begin.remove(self._on_begin)

    def _stop_count(self, window: _Window, step_ns: int) -> None:
        from otelprof.integrations import flops

        if self._counting is window:
            self._counting = None
        count = flops.stop(window.counter)
        window.counter = None
        window.counter_thread = 0
        if step_ns > 0:
            window.flop_count, window.flop_step_ns = count, step_ns
        window.counted.set()

    def _start(self, window: _Window) -> bool:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        try:
            from otelprof.runtime.session import get_session as _session

            current = _session()
            memory = bool(current is not None and current.config.profile_memory)
            with _warnings.untouched():  # the first start imports torch._inductor, whose imports add filters
                window.profiler = profile(activities=activities, record_shapes=False, with_stack=False,
                                          profile_memory=memory)
                window.thread = threading.get_ident()
                _watch_thread_end()
                with _quiet_stderr():
                    before = torch.empty(16) if memory else None
                    window.profiler.start()
                    del before  # see UNKNOWN_FREE_WARNING
            # from here: what starting the profiler allocates once (Kineto's buffers) is no event
            # a window over the job's first steps with none measured before it: their lazy allocations are no events
            warm_up = not self._step_heap.measured and window.start_step < BASELINE_STEPS
            step_heap = None if warm_up else self._step_heap.most
            window.watch = window_bounds.HeapWatch(self.costs.live_bytes_per_event, step_heap,
                                                   self.costs.events_per_second.get(window.phase or "", 0.0))
        except Exception as exc:  # another profiler is active, or Kineto is unavailable
            window.thread = 0
            warn_once("profile:start", "otelprof: cannot start torch.profiler (%s); window skipped", exc)
            return False
        window.started_ns = time.time_ns()
        window.epoch = self._epoch
        from otelprof.runtime.session import get_session

        session = get_session()
        recorder = getattr(session, "recorder", None)
        if recorder is not None:
            window.shift_ns = time.perf_counter_ns() + recorder.offset_ns - time.time_ns()
            # the window's steps are always traced, and never judged as outliers (otelprof slows them)
            recorder.arm_window(window.start_step, window.num_steps, slows=window.phase)
        self._running = window
        return True

    def _finish(self, window: _Window) -> None:
        ended_ns = time.time_ns()
        window.thread = 0
        try:
            with _quiet_stderr(), _warnings.untouched():
                window.profiler.stop()
        except Exception as exc:
            warn_once("profile:stop", "otelprof: torch.profiler failed to stop (%s)", exc)
            return
        self._processing += 1
        thread = threading.Thread(target=_summarize, args=(self, window, ended_ns), name="otelprof-profile",
                                  daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _processed(self, window: _Window) -> None:
        """The processing thread is done with ``window``: a capture or ``profile_window`` left steps for the
        next segment goes on with them from the next step (one segment in memory at a time), unless its session
        closed meanwhile."""
        start = hot.next_step_number(window.phase)
        if (window.until_step > start and window.trigger != "periodic" and hot._active is not None
                and window.epoch == self._epoch):
            follow = _Window(start, window.until_step - start, window.chrome_trace, window.top, window.trigger,
                             window.phase, window.on_finished, until_step=window.until_step,
                             segment=window.segment + 1, baseline_ns=window.baseline_ns, count_flops=False)
            self._add(follow)
        with self._lock:
            self._processing -= 1


def _stop_profiler(window: _Window) -> None:
    """Stop a dropped window's profiler (on the thread that started it), nothing recorded."""
    profiler, window.profiler, window.thread = window.profiler, None, 0
    window.measured.set()
    if profiler is not None:
        with contextlib.suppress(Exception), _quiet_stderr(), _warnings.untouched():
            profiler.stop()


_thread_end = threading.local()


class _AtThreadEnd:
    """Kept in a thread-local of a thread (other than the main one) that started a profiler or a FLOP counter:
    dropped as the thread ends, on that thread, it stops what the thread left running."""

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            windows.release_thread()


def _watch_thread_end() -> None:
    if threading.current_thread() is not threading.main_thread() and not hasattr(_thread_end, "watch"):
        _thread_end.watch = _AtThreadEnd()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to a temporary file while the profiler starts or stops: Kineto prints ``USDT: ...
    profiler_start`` lines there whatever its log level, and the training job's stderr is not ours to write to.
    What the job's other threads wrote meanwhile (the profiler calls release the GIL) is written back to the
    job's stderr afterwards, without Kineto's lines: nothing of theirs is lost."""
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(tempfile.TemporaryFile())
            saved = os.dup(2)
        except OSError:
            yield
            return
        stack.callback(os.close, saved)
        try:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(held.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            with contextlib.suppress(OSError):
                held.seek(0)
                kept = b"".join(line for line in held.read(_MAX_HELD).splitlines(keepends=True)
                                if not _KINETO_LINE.match(line))
                while kept:
                    kept = kept[os.write(saved, kept):]


_KINETO_LINE = re.compile(rb"(USDT|STAGE):|ERROR: External init callback|\[[WEI]\d{4} \d\d:\d\d:\d\d")
"""The lines the profiler prints on fd 2 as it starts or stops: Kineto's (``USDT: ... profiler_start``, ``ERROR:
External init callback must run in same thread ...``) and PyTorch's own log lines (``[W1208 00:53:04.76
CPUAllocator.cpp:245] Memory block of unknown size ...``, see UNKNOWN_FREE_WARNING)."""
_MAX_HELD = 1 << 20
"""Bytes of other threads' stderr written back after a profiler start or stop (more in those milliseconds: cut)."""


def _baseline_ns(window: _Window) -> float:
    """Mean period of the steps just before the window; without any (a capture starts at the next step), the
    median of the phase's recent steps as the recorder saw them (0: unknown)."""
    if window.baseline_ns:
        return window.baseline_ns
    begins = list(window.begins)
    if len(begins) >= 2:
        return (begins[-1] - begins[0]) / (len(begins) - 1)
    from otelprof.runtime.session import get_session

    recorder = getattr(get_session(), "recorder", None)
    typical = getattr(recorder, "typical_step", None)
    return typical(window.phase or hot.current_phase()) * 1e9 if typical is not None else 0.0


def _step_costs(window: _Window) -> tuple[float, float]:
    """Seconds the window's steps (with starting and stopping the profiler) took beyond as many steps at the
    baseline pace, and the FLOP-counted step beyond one."""
    baseline = _baseline_ns(window)
    if not baseline or not window.after_ns or not window.begins:
        return 0.0, 0.0
    steps = window.steps_profiled or window.num_steps
    window_ns = max((window.after_ns - window.begins[-1]) - steps * baseline, 0.0)
    return window_ns / 1e9, max(window.flop_step_ns - baseline, 0.0) / 1e9


def _step_overhead(window: _Window) -> float:
    """The window's steps beyond as many steps at the baseline pace, and the FLOP-counted step beyond one."""
    steps_s, flop_s = _step_costs(window)
    return steps_s + flop_s


class _Pacer:
    """Sleeps after each chunk so that the processing thread runs at most PROCESS_SHARE of the wall clock."""

    def __init__(self) -> None:
        self._mark = time.thread_time()

    def pause(self) -> None:
        ran = time.thread_time() - self._mark
        time.sleep(min(ran * (1 / PROCESS_SHARE - 1), 1.0))
        self._mark = time.thread_time()


class _TraceFile:
    """A trace file as :func:`_kineto_trace` gives it: ``get("traceEvents")`` streams its events (bounded memory),
    after which ``get`` answers its other members."""

    def __init__(self, path: str, temporary: bool) -> None:
        self.path = path
        self.temporary = temporary
        self.header: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        if key == "traceEvents":
            return operators.read_trace_file(self.path, self.header)
        return self.header.get(key, default)

    def close(self) -> None:
        if self.temporary:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _kineto_trace(window: _Window, keep: str | None) -> Mapping[str, Any] | _TraceFile | None:
    """The window's Kineto trace, written to ``keep`` (else a temporary file) and read back as a stream; the
    profiler's results are freed once it is written. None when it cannot be written."""
    if keep is None:
        fd, path = tempfile.mkstemp(prefix="otelprof-profile-", suffix=".json")
        os.close(fd)
    else:
        path = keep
    try:
        window.profiler.export_chrome_trace(path)
        return _TraceFile(path, keep is None)
    except (OSError, RuntimeError) as exc:
        warn_once("profile:trace", "otelprof: cannot write the profiler's trace (%s); no operator spans", exc)
        if keep is None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return None
    finally:
        _release(window)


def _profile_span(builder: SpanBuilder, window: _Window, summary: dict[str, Any], ended_ns: int) -> list[Any]:
    """The window's ``otelprof.profile`` span, its top operators as events (none when the sampler drops it)."""
    attributes = {sc.ATTR_PROFILE_START: window.start_step,
                  sc.ATTR_PROFILE_STEPS: window.steps_profiled or window.num_steps,
                  sc.ATTR_PROFILE_TRIGGER: window.trigger}
    context = builder.new_trace(sc.SPAN_PROFILE, attributes)
    if context is None:
        return []
    events = [Event("operator", {sc.ATTR_OP_NAME: op["name"], sc.ATTR_OP_DEVICE: device, sc.ATTR_OP_CALLS: op["calls"],
                                 sc.ATTR_OP_SELF_TIME: op["self_s"], sc.ATTR_OP_TOTAL_TIME: op["total_s"]}, ended_ns)
              for device, ops in (("cpu", summary["cpu_ops"]), ("gpu", summary["gpu_ops"])) for op in ops]
    return [builder.span(sc.SPAN_PROFILE, context, None, window.started_ns, ended_ns, attributes, events)]


def _release(window: _Window) -> None:
    """Free the profiler's results now (they hold about 2 kB an event; the profiler object is in a reference cycle
    that only the garbage collector would break)."""
    inner = getattr(window.profiler, "profiler", None)
    if inner is not None:
        with contextlib.suppress(AttributeError):
            inner.kineto_results = None
    window.profiler = None


def _read(trace: Mapping[str, Any] | _TraceFile, max_events: int, pacer: _Pacer,
          shift_ns: int) -> tuple[operators.ParsedTrace, int, int]:
    """The trace parsed in bounded memory: at most ``max_events`` events kept; (parsed, kept, dropped)."""
    collector = operators.TraceCollector(max_events, pacer.pause)
    events = trace.get("traceEvents")
    for index, event in enumerate(events if isinstance(events, (list, Iterator)) else ()):
        collector.add(event)
        if index % operators.CHUNK == operators.CHUNK - 1:
            pacer.pause()
    base = trace.get("baseTimeNanoseconds")
    parsed = collector.finish((base if isinstance(base, int) else 0) + shift_ns)
    return parsed, collector.kept, collector.dropped


def _summarize(windows: ProfileWindows, window: _Window, ended_ns: int) -> None:
    began = time.thread_time()
    try:
        with _warnings.untouched():
            _process(windows, window, ended_ns, began)
    except Exception:
        logger.exception("otelprof: summarizing a profiling window failed")
        if window.on_finished is not None:
            window.on_finished(0.0)
    finally:
        _release(window)
        windows._processed(window)


def _process(windows: ProfileWindows, window: _Window, ended_ns: int, began: float) -> None:
    from otelprof.runtime.session import get_session

    session = get_session()
    if session is None:
        return
    config = session.config
    max_events = window.max_events
    pacer = _Pacer()
    record: dict[str, Any] = {"start_step": window.start_step, "num_steps": window.steps_profiled or window.num_steps,
                              "phase": window.phase, "trigger": window.trigger,
                              "t": window.started_ns, "d": ended_ns - window.started_ns}
    keep = None
    if window.chrome_trace and session.run_dir is not None:
        keep = str(session.run_dir / f"profile-step{window.start_step}.trace.json")
    trace = _kineto_trace(window, keep)
    _release(window)
    kept = dropped = 0
    summary = summarize_parsed(operators.ParsedTrace(), window.top)
    recorder = session.recorder
    wait = max(AFTER_STEP_WAIT, 2 * _baseline_ns(window) / 1e9)  # slow steps: the step after may take minutes
    if trace is not None:
        try:
            parsed: operators.ParsedTrace | None
            parsed, kept, dropped = _read(trace, max_events, pacer, window.shift_ns)
        except (OSError, ValueError) as exc:
            warn_once("profile:read", "otelprof: cannot read the profiler's trace (%s); no operator spans", exc)
            parsed = None
        finally:
            if isinstance(trace, _TraceFile):
                trace.close()
        if parsed is not None:
            summary = summarize_parsed(parsed, window.top)
            if keep is not None:
                record["trace_file"] = os.path.basename(keep)
            window_stats = operators.window_summary(parsed, config.profile_top_k, kernel_precision)
            record["operators"] = window_stats
            window.measured.wait(wait)  # a window stopped mid-step: its last step's record comes as it ends
            recorder.drain()  # the window's step records, so that their spans exist
            steps = recorder.window_steps(window.phase or hot.current_phase(), window.start_step,
                                          window.steps_profiled or window.num_steps)
            spans, spans_dropped = operators.operator_spans(recorder.span_builder, parsed, steps,
                                                            config.profile_max_spans)
            recorder.add_spans(spans, spans_dropped)
            record["operator_spans"] = len(spans)
            record["operator_spans_dropped"] = spans_dropped
            operators.set_metrics(session.registry, window_stats, max(window.steps_profiled, 1))
            del parsed, spans
    record.update(summary)
    if dropped and window.truncated is None:
        window.truncated = "events"
    growth = window.watch.growth() if window.watch is not None else 0
    busy_s = window.watch.busy_seconds if window.watch is not None else 0.0  # as the watch reads it
    windows.costs.learn(window.phase, kept + dropped, window.whole_steps, growth, busy_s)
    record["events"] = {"kept": kept, "dropped": dropped, "max": max_events, "heap_growth_bytes": growth,
                        "per_step": round(windows.costs.events_per_step.get(window.phase or "", 0.0), 1)}
    record["segment"] = window.segment
    if window.truncated is not None:
        record["truncated"] = window.truncated
        # otelprof's own bookkeeping, counted (PROFILE_TRUNCATED) and in the window's record: never on the job's stderr
        info_once("profile:truncated", "otelprof: a profiling window reached %d profiler events (%s steps of "
                  "phase %s); windows stop there and later ones are planned shorter (OTELPROF_PROFILE_MAX_EVENTS)",
                  max_events, window.steps_profiled, window.phase)
    if window.measured.wait(wait):
        window.counted.wait(wait)
    if window.flop_count is not None:
        from otelprof.integrations import flops

        model = session.resource.attributes.get(sc.OTELPROF_GPU_MODEL)
        figures = flops.figures(window.flop_count, _baseline_ns(window) / 1e9, str(model) if model else None,
                                config.peak_flops)
        record["flops"] = figures
        flops.set_metrics(session.registry, figures)
    steps_s, flop_s = _step_costs(window)
    processing_s = time.thread_time() - began
    overhead = steps_s + flop_s + processing_s
    record["overhead_s"] = overhead
    record["cost"] = {"steps_s": steps_s, "flop_step_s": flop_s, "processing_s": processing_s}
    if session.writer is not None:
        session.writer.add_json(schema.PROFILES, record)
    recorder.add_spans(_profile_span(recorder.span_builder, window, summary, ended_ns), reason="window")
    with session.registry.lock:
        registry = session.registry
        registry.counter(sc.PROFILE_WINDOWS).add(1)
        registry.counter(sc.PROFILE_OVERHEAD).add(overhead)
        cost = registry.counter(sc.PROFILE_COST)
        for part, seconds in (("steps", steps_s), ("flop_step", flop_s), ("processing", processing_s)):
            cost.add(seconds, (part,))
        events = registry.counter(sc.PROFILE_EVENTS)
        events.add(kept, ("kept",))
        events.add(dropped, ("dropped",))
        if window.truncated is not None:
            registry.counter(sc.PROFILE_TRUNCATED).add(1, (window.truncated,))
    if window.on_finished is not None:
        window.on_finished(overhead)


windows = ProfileWindows()
"""The process's profiling windows: the PyTorch integration's, captures' and the periodic schedule's."""
extensions.register_profiler(windows, "torch")
