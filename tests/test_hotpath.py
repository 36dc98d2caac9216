"""The hot path's own bookkeeping: region depth per step, the automatic steps' fast opening, region ends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof.runtime import hotpath as hot


@pytest.fixture
def session(tmp_path: Path) -> Any:
    return otelprof.init(record_dir=str(tmp_path), system_metrics=False, flush_interval=60.0)


def _regions(step: hot.StepContext) -> list[tuple[str, int]]:
    return [(name, depth) for name, _, _, depth, _ in step.annotations]


def test_a_nested_step_counts_its_regions_from_zero_and_leaves_the_outer_ones_alone(session: Any) -> None:
    with otelprof.step() as outer:
        with otelprof.annotate("a"):
            with otelprof.step() as inner:
                with otelprof.annotate("b"):
                    with otelprof.annotate("c"):
                        pass
            with otelprof.annotate("d"):
                pass
        with otelprof.annotate("e"):
            pass
    assert _regions(inner) == [("c", 1), ("b", 0)]
    assert _regions(outer) == [("d", 1), ("a", 0), ("e", 0)]
    assert outer.depth == 0 and inner.depth == 0


def test_a_region_that_outlives_its_step_stands_alone_and_leaves_the_next_step_alone(session: Any) -> None:
    region = otelprof.annotate("checkpoint")
    with otelprof.step() as first:
        region.__enter__()
    with otelprof.step() as second:
        with otelprof.annotate("forward"):
            region.__exit__(None, None, None)  # recorded on its own: its step has closed
            with otelprof.annotate("attention"):
                pass
    assert _regions(first) == []
    assert _regions(second) == [("attention", 1), ("forward", 0)]


def test_regions_on_another_thread_belong_to_that_thread_s_step(session: Any) -> None:
    seen: list[hot.StepContext] = []

    def worker() -> None:
        with otelprof.annotate("outside"):
            pass
        with otelprof.step(phase="worker") as step:
            with otelprof.annotate("inside"):
                pass
        seen.append(step)

    with otelprof.step() as main:
        with otelprof.annotate("main"):
            thread = threading.Thread(target=worker)
            thread.start()
            thread.join()
    assert _regions(main) == [("main", 0)]
    assert _regions(seen[0]) == [("inside", 0)]


def test_the_fast_step_opening_matches_the_class(session: Any) -> None:
    begun: list[hot.StepContext] = []
    hot._step_begin.append(begun.append)
    try:
        with otelprof.step() as marked:
            pass
        fast = hot._begin_step(None)
    finally:
        hot._step_begin.clear()
    assert hot._tls.step is fast and begun == [marked, fast]
    assert (fast.phase, fast.number, fast.annotations, fast.scalars, fast.closed, fast.depth) == \
        ("train", marked.number + 1, [], None, False, 0)
    assert fast.start_ns >= marked.start_ns
    fast.__exit__(None, None, None)
    assert hot._tls.step is None and fast.closed
    with otelprof.step() as after:
        pass
    assert after.number == fast.number + 1


def test_end_region_keeps_the_bound_and_records_a_late_region_on_its_own(
        session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted: list[tuple[Any, ...]] = []
    monkeypatch.setattr(session.recorder, "submit", submitted.append)
    monkeypatch.setattr(hot, "MAX_STEP_ANNOTATIONS", 1)
    dropped = hot.dropped_regions
    with otelprof.step() as step:
        step.depth = 1
        hot._end_region("kept", 1, step, 0)
        step.depth = 1
        hot._end_region("dropped", 2, step, 0)
    assert _regions(step) == [("kept", 0)] and step.depth == 0
    assert hot.dropped_regions == dropped + 1
    hot._end_region("late", 3, step, 0)  # the step has closed
    assert [r[:3] for r in submitted if r[0] == hot.ANNOTATION] == [(hot.ANNOTATION, "late", "train")]


def test_a_full_record_queue_drops_and_counts_steps_instead_of_growing(tmp_path: Path) -> None:
    from otelprof import semconv as sc

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, flush_interval=10.0, queue_size=64)
    assert isinstance(session, otelprof.Session)
    with session.recorder._drain_lock:  # the background thread cannot process while the steps run
        for _ in range(100):
            with otelprof.step():
                pass
        assert len(session.recorder.queue) == 64
    session.recorder.drain()
    dropped = {p.attributes[sc.LABEL_EXPORTER]: p.value for m in session.registry.collect()
               if m.name == sc.EXPORTER_DROPPED.name for p in m.data.data_points}
    assert dropped[sc.DROPPED_QUEUE] == 36
    steps = {m.name: m for m in session.registry.collect()}[sc.STEPS.name]
    assert steps.data.data_points[0].value == 64


@pytest.mark.parametrize(("step_ns", "paced"), [(5_000_000, True), (300_000, False)])
def test_the_background_thread_processes_long_steps_one_at_a_time_and_short_ones_in_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_ns: int, paced: bool) -> None:
    """Between records the background thread sleeps for real (the GIL goes to the training thread) when steps
    are long; short steps go in chunks; a drain from another thread (a scrape, shutdown) never sleeps."""
    from otelprof.runtime import recorder as rec_module

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, flush_interval=10.0)
    assert isinstance(session, otelprof.Session)
    recorder = session.recorder
    sleeps: list[float] = []
    monkeypatch.setattr(rec_module, "_sleep", sleeps.append)

    def queue_steps(count: int) -> None:
        for number in range(count):
            recorder.submit((hot.STEP, "train", number, number * step_ns, (number + 1) * step_ns, [], None, None))

    with recorder._drain_lock:
        queue_steps(1)
    recorder.drain()  # the first step tells the pace
    assert sleeps == [0]
    sleeps.clear()
    with recorder._drain_lock:
        queue_steps(40)
    recorder.drain(background=True)
    assert not recorder.queue
    assert sleeps == ([rec_module.BACKGROUND_PAUSE] * 40 if paced else [0] * 3)
    # The per-phase totals, applied once at the end of the drain, count every record of it. Read from the
    # instruments directly: a collection would drain (and apply them) again.
    with recorder.registry.lock:
        assert recorder.steps.values == {("train",): 41}
        assert recorder.step_number.values == {("train",): 39}
    sleeps.clear()
    with recorder._drain_lock:
        queue_steps(40)
    recorder.drain()
    assert sleeps == [0] * 3


def test_a_backlog_is_processed_at_full_speed_even_for_long_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from otelprof.runtime import recorder as rec_module

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, flush_interval=10.0)
    assert isinstance(session, otelprof.Session)
    recorder = session.recorder
    recorder._last_step_ns = 10_000_000
    sleeps: list[float] = []
    monkeypatch.setattr(rec_module, "_sleep", sleeps.append)
    monkeypatch.setattr(rec_module, "GENTLE_BACKLOG", 8)
    with recorder._drain_lock:
        for number in range(32):
            recorder.submit((hot.STEP, "train", number, 0, 10_000_000, [], None, None))
    recorder.drain(background=True)
    assert not recorder.queue and sleeps == [0, 0]
