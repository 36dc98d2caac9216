"""The hot path's own bookkeeping: region depth per step, the automatic steps' fast opening, region ends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof import hotpath as hot


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
