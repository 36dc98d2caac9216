"""Bad arguments to the public API: never an exception into the caller, never a broken recording.

Every argument otelprof cannot use is dropped, counted (``otelprof.exporter.dropped{exporter=
"invalid_argument"}``) and reported once per kind; the call it came with, the step it belongs to and every
record queued after it go on. Targeted cases first, then a property-based fuzz over the API calls.
"""

from __future__ import annotations

import dataclasses
import decimal
import fractions
import json
import logging
import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otelprof
from otelprof import _arguments
from otelprof import semconv as sc
from otelprof.recording import schema
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from otelprof.runtime import hotpath as hot
from otelprof.runtime.recorder import Recorder

QUIET = {"system_metrics": False, "handle_sigterm": False}


def _strict(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def strict_lines(rank: RankRecording) -> list[dict[str, Any]]:
    """Every line of steps.jsonl, parsed as strict JSON (no NaN/Infinity); fails on the first that is not."""
    out = []
    for line in (rank.path / schema.STEPS).read_text(encoding="utf-8").splitlines():
        out.append(json.loads(line, parse_constant=_strict))
    return out


def run(record_dir: Path, body: Callable[[], None], **settings_: Any) -> RankRecording:
    session = otelprof.init(job_name="args", record_dir=str(record_dir), **{**QUIET, **settings_})
    assert isinstance(session, otelprof.Session)
    body()
    assert session.run_dir is not None
    otelprof.shutdown()
    rank = read_recording(session.run_dir.parent).ranks[0]
    assert rank.skipped_lines == 0
    strict_lines(rank)
    return rank


def invalid_dropped(rank: RankRecording) -> float:
    return float(rank.manifest["dropped"].get(sc.DROPPED_INVALID, 0))


def warnings_of(caplog: pytest.LogCaptureFixture, needle: str = "") -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "otelprof" and r.levelno >= logging.WARNING and needle in r.getMessage()]


@pytest.fixture(autouse=True)
def _warnings(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.WARNING, logger="otelprof")
    yield


# ---------------------------------------------------------------------- the defects as found


def test_a_huge_int_loses_neither_its_step_nor_the_records_queued_after_it(record_dir: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """record("loss", 10**400) used to raise in the recorder, which lost the step and, at shutdown, every
    record queued after it."""
    def body() -> None:
        with otelprof.step():
            otelprof.record("loss", 10**400)
            otelprof.record("samples", 32)
        otelprof.record("loss", -(10**400))  # outside a step
        for i in range(5):
            with otelprof.step():
                otelprof.record("loss", 1.0 / (i + 1))

    rank = run(record_dir, body, flush_interval=10.0)  # everything still queued at shutdown
    assert [s.number for s in rank.steps] == list(range(6))
    assert rank.steps[0].scalars == {"samples": 32.0}
    assert [s.scalars["loss"] for s in rank.steps[1:]] == [1.0 / (i + 1) for i in range(5)]
    assert rank.scalars == []
    assert invalid_dropped(rank) == 2
    assert len(warnings_of(caplog, "not a number")) == 1
    assert not warnings_of(caplog, "internal error")


def test_names_that_are_not_strings_are_dropped_and_the_recording_stays_json(record_dir: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """record(None, 1.0) used to write {"x":{null:1.0}}: not JSON, and the reader skipped the step."""
    class Unhashable:
        def __hash__(self) -> int:
            raise RuntimeError("hash")

    def body() -> None:
        with otelprof.step():
            otelprof.record(None, 1.0)  # type: ignore[arg-type]
            otelprof.record(7, 2.0)  # type: ignore[arg-type]
            otelprof.record(("a", 1), 3.0)  # type: ignore[arg-type]
            otelprof.record(["unhashable"], 4.0)  # type: ignore[arg-type]
            otelprof.record("", 5.0)
            otelprof.record(b"bytes", 6.0)  # type: ignore[arg-type]
            otelprof.record(Unhashable(), 7.0)  # type: ignore[arg-type]
            otelprof.record("loss", 0.5)
        otelprof.record(None, 1.0)  # type: ignore[arg-type]
        otelprof.record({}, 1.0)  # type: ignore[arg-type]
        otelprof.record("lr", 0.1)

    rank = run(record_dir, body)
    assert [s.scalars for s in rank.steps] == [{"loss": 0.5}]
    assert [(name, value) for _, _, name, value in rank.scalars] == [("lr", 0.1)]
    assert invalid_dropped(rank) == 9
    assert len(warnings_of(caplog, "record() got a name")) == 1, "one warning for the kind, not one per call"


def test_step_arguments_of_the_wrong_type_fall_back_to_the_automatic_ones(record_dir: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """step(number="x") used to raise TypeError into the training loop."""
    class Bomb:
        def __index__(self) -> int:
            raise ZeroDivisionError

        def __bool__(self) -> bool:
            raise ZeroDivisionError

        def __hash__(self) -> int:
            raise ZeroDivisionError

        def __eq__(self, other: object) -> bool:
            raise ZeroDivisionError

    bad_numbers: list[Any] = ["x", 3.0, float("nan"), float("inf"), -1, 2**63, 10**400, None, Bomb(), [1]]
    bad_phases: list[Any] = [5, ["x"], Bomb(), np.array([1, 2]), b"eval"]

    def body() -> None:
        for number in bad_numbers:
            with otelprof.step(number=number):
                pass
        for bad_phase in bad_phases:
            with otelprof.step(phase=bad_phase):
                pass
        with otelprof.step(number=np.int64(100)):  # numpy integers are integers
            pass
        with otelprof.step(phase=""):  # "" is the current phase, as None
            pass
        with otelprof.step(phase="eval", number=True):
            pass

    rank = run(record_dir, body)
    automatic = len(bad_numbers) + len(bad_phases)
    assert [(s.phase, s.number) for s in rank.steps] == (
        [("train", i) for i in range(automatic)] + [("train", 100), ("train", 101), ("eval", 1)])
    assert invalid_dropped(rank) == len(bad_numbers) - 1 + len(bad_phases)  # None is the automatic number
    assert len(warnings_of(caplog, "step(number=...)")) == 1
    assert len(warnings_of(caplog, "step(phase=...)")) == 1


def test_regions_and_phases_with_bad_names(record_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    def body() -> None:
        with otelprof.step():
            with otelprof.annotate(None):  # type: ignore[arg-type]
                pass
            with otelprof.annotate(""):
                pass
            with otelprof.annotate("forward"):
                pass
            otelprof.annotation_begin(["unhashable"])  # type: ignore[arg-type]
            otelprof.annotation_end(["unhashable"])  # type: ignore[arg-type]
            for i in range(50):
                otelprof.annotation_end(f"never-begun-{i}")

        @otelprof.annotate(42)  # type: ignore[arg-type]
        def double(x: int) -> int:
            return 2 * x

        assert double(21) == 42
        with otelprof.phase(None):  # type: ignore[arg-type]
            with otelprof.step():
                pass
        otelprof.phase(np.float64(1.0))  # type: ignore[arg-type]
        with otelprof.step():
            pass

    rank = run(record_dir, body)
    assert [(s.phase, [a.name for a in s.annotations]) for s in rank.steps] == [
        ("train", ["forward"]), ("train", []), ("train", [])]
    assert invalid_dropped(rank) == 2 + 2 + 50 + 1 + 2
    assert len(warnings_of(caplog, "without annotation_begin")) == 1, "not one warning per unknown name"
    assert len(warnings_of(caplog, "annotate() got a name")) == 1


def test_long_and_unencodable_names_are_cut_everywhere(record_dir: Path) -> None:
    long_name = "x" * 100_000

    def body() -> None:
        with otelprof.phase("p" * 10_000):
            with otelprof.step():
                with otelprof.annotate(long_name):
                    pass
                with otelprof.annotate("bad\ud800surrogate"):
                    pass
                otelprof.record(long_name, 1.0)
        with otelprof.step(phase="q" * 10_000):
            pass
        with otelprof.annotate(long_name):  # outside steps
            pass

    rank = run(record_dir, body, span_every=1)
    cut = "x" * _arguments.MAX_NAME_LENGTH
    assert [s.phase for s in rank.steps] == ["p" * _arguments.MAX_NAME_LENGTH, "q" * _arguments.MAX_NAME_LENGTH]
    assert [a.name for a in rank.steps[0].annotations] == [cut, "bad?surrogate"]
    assert rank.steps[0].scalars == {cut: 1.0}
    assert [a.name for a in rank.annotations] == [cut]
    spans = {s.name for s in rank.spans()}
    assert {cut, "bad?surrogate"} <= spans
    assert max(len(line) for line in (rank.path / schema.STEPS).read_text().splitlines()) < 2_000


def test_values_of_every_kind(record_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    class FloatRaises:
        def __float__(self) -> float:
            raise ZeroDivisionError("no float")

    class ItemRaises:
        @property
        def item(self) -> Any:
            raise KeyError("no item")

    class Opaque:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(name)

    class WeirdFloat:
        def __float__(self) -> Any:
            return "not a float"

    good: dict[str, Any] = {
        "float": 0.5, "int": 3, "bool": True, "np_float32": np.float32(0.25), "np_int64": np.int64(7),
        "np_bool": np.bool_(False), "np_0d": np.array(1.5), "tensor": torch.tensor(2.5),
        "tensor_grad": torch.tensor(4.0, requires_grad=True) * 1, "decimal": decimal.Decimal("1.25"),
        "fraction": fractions.Fraction(1, 4), "nan": float("nan"), "inf": float("inf"), "big_int": 2**1000,
        "list": [1.0, torch.tensor(2.0), 3],  # a list is the sum of its parts (how the integrations record losses)
    }
    bad: dict[str, Any] = {
        "str": "0.5", "bytes": b"1", "none": None, "list_of_str": ["a"], "list_huge": [10**400], "empty_tuple": (),
        "complex": 1j, "tensor_many": torch.ones(3),
        "np_many": np.ones(2), "float_raises": FloatRaises(), "item_raises": ItemRaises(), "weird": WeirdFloat(),
        "huge": 10**400, "huge_fraction": fractions.Fraction(10**400, 3), "object": object(), "opaque": Opaque(),
    }

    def body() -> None:
        with otelprof.step():
            for name, value in {**good, **bad}.items():
                otelprof.record(name, value)
        for name, value in {**good, **bad}.items():
            otelprof.record(name, value)

    rank = run(record_dir, body)
    [step] = rank.steps
    assert step.scalars.keys() == good.keys()
    for name, value in good.items():
        expected = float(sum(value) if isinstance(value, list) else value.item() if hasattr(value, "item") else value)
        got = step.scalars[name]
        assert got == expected or (math.isnan(got) and math.isnan(expected)), name
    assert [name for _, _, name, _ in rank.scalars] == list(good)
    assert invalid_dropped(rank) == 2 * len(bad)
    assert len(warnings_of(caplog, "not a number")) == 1


def test_a_record_that_fails_to_process_costs_only_itself(record_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Whatever slips past the checks: the recorder catches per record, counts it and goes on."""
    annotation = Recorder._annotation

    def failing(self: Recorder, name: str, *rest: Any) -> None:
        if name == "poison":
            raise RuntimeError("a bug \x1b[2J in processing")
        annotation(self, name, *rest)

    monkeypatch.setattr(Recorder, "_annotation", failing)

    def body() -> None:
        with otelprof.step():
            pass
        for name in ("before", "poison", "after", "poison"):
            with otelprof.annotate(name):
                pass
        for _ in range(3):
            with otelprof.step():
                pass

    rank = run(record_dir, body, flush_interval=10.0)
    assert [s.number for s in rank.steps] == [0, 1, 2, 3]
    assert [a.name for a in rank.annotations] == ["before", "after"]
    assert rank.manifest["dropped"][sc.DROPPED_RECORD_ERROR] == 2
    [warning] = warnings_of(caplog, "could not be processed")
    assert "RuntimeError" in warning and "\x1b" not in warning


def test_session_methods_with_bad_arguments(record_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    session = otelprof.init(job_name="args", record_dir=str(record_dir), **QUIET)
    assert isinstance(session, otelprof.Session)
    with otelprof.step():
        pass
    session.flush(timeout="soon")  # type: ignore[arg-type]
    session.flush(timeout=float("nan"))
    session.flush(timeout=-1)
    assert session.capture(steps="many") == {  # type: ignore[arg-type]
        "armed": False, "error": "steps must be an integer from 1 to 10000"}
    assert session.capture(steps=10**9)["armed"] is False
    session.on_stop(42)  # type: ignore[arg-type]
    stopping = session.request_stop(reason=object(), alert=["x"])  # type: ignore[arg-type]
    assert stopping["reason"] == "requested"
    assert session.should_stop()
    with otelprof.step():
        pass
    otelprof.shutdown(timeout=float("inf"))  # a finite default instead
    assert otelprof.get_session() is None
    rank = read_recording(session.run_dir.parent).ranks[0]  # type: ignore[union-attr]
    assert [s.number for s in rank.steps] == [0, 1]
    assert rank.manifest["status"] == schema.STATUS_FINISHED
    assert rank.manifest["stop"]["reason"] == "requested"
    assert invalid_dropped(rank) == 8  # flush(-1) is flush(0)
    assert not warnings_of(caplog, "internal error")


def test_begun_regions_that_never_end_are_bounded(record_dir: Path) -> None:
    def body() -> None:
        for i in range(hot.MAX_STEP_ANNOTATIONS + 100):
            otelprof.annotation_begin(f"open-{i}")
        assert len(hot._open_regions) == hot.MAX_STEP_ANNOTATIONS
        otelprof.annotation_end("open-0")
        otelprof.annotation_begin("late")
        otelprof.annotation_end("late")

    rank = run(record_dir, body)
    assert [a.name for a in rank.annotations] == ["open-0", "late"]
    assert invalid_dropped(rank) == 100


# ---------------------------------------------------------------------- fuzzing


class _Hostile:
    """An object whose conversions raise (hashing, equality and attribute lookup are left to the targeted
    tests: the fuzzer itself hashes and compares what it draws)."""

    def __float__(self) -> float:
        raise RuntimeError("float")

    def __index__(self) -> int:
        raise RuntimeError("index")

    def __bool__(self) -> bool:
        raise RuntimeError("bool")

    def __str__(self) -> str:
        raise RuntimeError("str")

    def __len__(self) -> int:
        raise RuntimeError("len")

    def __repr__(self) -> str:
        return "_Hostile()"


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**500), max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=300), st.binary(max_size=20),
    st.complex_numbers(), st.decimals(), st.fractions(),
    st.sampled_from([np.float32(1.5), np.int64(-3), np.bool_(True), np.float64("nan"), np.array([1.0, 2.0]),
                     np.array(3.0), torch.tensor(1.0), torch.ones(2), _Hostile(), object(), float]),
)
arguments = st.one_of(scalars, st.lists(scalars, max_size=3), st.tuples(scalars, scalars),
                      st.dictionaries(st.text(max_size=5), scalars, max_size=2))
names = st.one_of(st.sampled_from(["loss", "forward", "train", "eval", "samples", "grad_norm", ""]),
                  st.text(max_size=400), arguments)

calls = st.deferred(lambda: st.one_of(
    st.tuples(st.just("record"), names, arguments),
    st.tuples(st.just("annotate"), names, st.lists(calls, max_size=3)),
    st.tuples(st.just("begin"), names),
    st.tuples(st.just("end"), names),
    st.tuples(st.just("phase"), names),
    st.tuples(st.just("step"), st.one_of(st.none(), names), st.one_of(st.none(), arguments),
              st.lists(calls, max_size=4)),
))


def perform(call: tuple[Any, ...]) -> int:
    """Run one fuzzed call (and the calls nested in it); the number of steps it opened."""
    kind = call[0]
    if kind == "record":
        otelprof.record(call[1], call[2])
    elif kind == "begin":
        otelprof.annotation_begin(call[1])
    elif kind == "end":
        otelprof.annotation_end(call[1])
    elif kind == "phase":
        otelprof.phase(call[1])
    elif kind == "annotate":
        with otelprof.annotate(call[1]):
            return sum(perform(inner) for inner in call[2])
    elif kind == "step":
        with otelprof.step(phase=call[1], number=call[2]):
            return 1 + sum(perform(inner) for inner in call[3])
    return 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(calls, min_size=1, max_size=12))
def test_fuzz_the_api_never_raises_and_the_recording_stays_valid(program: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        session = otelprof.init(job_name="fuzz", record_dir=tmp, span_every=1, **QUIET)
        assert isinstance(session, otelprof.Session)
        try:
            opened = sum(perform(call) for call in program)  # raises only if otelprof raised into the caller
            otelprof.shutdown()
        finally:
            otelprof.shutdown()
        rank = read_recording(Path(tmp) / session.config.run_id).ranks[0]
        lines = strict_lines(rank)  # every line strict JSON
        assert rank.skipped_lines == 0
        assert len(rank.steps) == opened, "every step the program ran is in the recording, once"
        assert rank.manifest["status"] == schema.STATUS_FINISHED
        assert sc.DROPPED_RECORD_ERROR not in rank.manifest["dropped"], "no record failed to process"
        for line in lines:
            if line["k"] == "s":
                assert type(line["n"]) is int and 0 <= line["n"] < 2**63
                assert all(type(k) is str and 0 < len(k) <= _arguments.MAX_NAME_LENGTH for k in line.get("x", {}))
            for name in [line.get("ph"), line.get("name")] + [a[0] for a in line.get("a", [])]:
                assert name is None or (type(name) is str and len(name) <= _arguments.MAX_NAME_LENGTH)


def test_init_with_a_run_id_that_is_a_path_records_inside_record_dir(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    record_dir = tmp_path / "runs"
    for run_id in ("../escape", "/tmp/abs", "a/b", "..", "x" * 300):
        session = otelprof.init(run_id=run_id, record_dir=str(record_dir), **QUIET)
        assert isinstance(session, otelprof.Session)
        assert session.run_dir is not None and session.run_dir.parent.parent == record_dir
        otelprof.shutdown()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert len(list(record_dir.iterdir())) == 5
    assert len(warnings_of(caplog, "run_id")) == 5, "one warning per init()"


_FIELDS = sorted(f.name for f in dataclasses.fields(otelprof.Config) if f.name not in ("record_dir", "disabled"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_FIELDS), arguments, min_size=1, max_size=3))
def test_fuzz_init_never_raises_and_keeps_the_declared_types(overrides: dict[str, Any]) -> None:
    overrides = {**overrides, "record": True, "system_metrics": False, "handle_sigterm": False, "metrics_exporters": (),
                 "traces_exporters": (), "control_port": 0}  # no servers or exporters: a fuzzed port may be in use
    with tempfile.TemporaryDirectory() as tmp:
        session = otelprof.init(record_dir=tmp, **overrides)
        try:
            assert isinstance(session, otelprof.Session)
            defaults = otelprof.Config()
            for field in dataclasses.fields(session.config):
                assert type(getattr(session.config, field.name)) is type(getattr(defaults, field.name)), field.name
            with otelprof.step():
                otelprof.record("loss", 1.0)
        finally:
            otelprof.shutdown()
        rank = read_recording(Path(tmp) / session.config.run_id).ranks[0]
        assert len(rank.steps) == 1


def test_a_step_with_too_many_scalar_names_keeps_the_first_ones(record_dir: Path) -> None:
    def body() -> None:
        with otelprof.step():
            for i in range(_arguments.MAX_STEP_SCALARS + 50):
                otelprof.record(f"s{i}", float(i))

    rank = run(record_dir, body)
    assert rank.steps[0].scalars == {f"s{i}": float(i) for i in range(_arguments.MAX_STEP_SCALARS)}
    assert invalid_dropped(rank) == 50
