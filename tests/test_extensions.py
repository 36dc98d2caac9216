"""The runtime's extension hook: integrations that live as long as a session register with it, the core never
imports them. Every session starts what is registered, and stops it, the last first, within its shutdown deadline
and before its recording closes; a starter or a stop that fails costs only itself."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import otelprof
from otelprof.config import Config
from otelprof.recording import schema
from otelprof.runtime import extensions, profile_schedule


class Probe:
    def __init__(self, name: str, events: list[tuple[str, object]], session_dir: list[Path]) -> None:
        self.name = name
        self.events = events
        self.session_dir = session_dir

    def stop(self, timeout: float) -> None:
        manifest = json.loads((self.session_dir[0] / schema.MANIFEST).read_text())
        self.events.append((f"stop {self.name}", (timeout, manifest["status"])))


@pytest.fixture
def registered() -> Iterator[list[extensions.Starter]]:
    added: list[extensions.Starter] = []
    yield added
    for starter in added:
        extensions._starters.remove(starter)


def test_a_session_starts_registered_extensions_and_stops_them_last_first_before_its_recording_closes(
        tmp_path: Path, registered: list[extensions.Starter]) -> None:
    events: list[tuple[str, object]] = []
    run_dir: list[Path] = []

    def starter(name: str) -> extensions.Starter:
        def start(config: Config) -> Probe:
            events.append((f"start {name}", config.job_name))
            return Probe(name, events, run_dir)
        return start

    first, second = starter("first"), starter("second")
    for s in (first, second, first):  # registering one again does nothing
        extensions.register(s)
    registered += [first, second]
    session = otelprof.init(job_name="hooked", record_dir=str(tmp_path), system_metrics=False, profile_every=0,
                            shutdown_timeout=5.0)
    assert session.run_dir is not None
    run_dir.append(session.run_dir)
    assert events == [("start first", "hooked"), ("start second", "hooked")]
    otelprof.shutdown()
    assert [name for name, _ in events[2:]] == ["stop second", "stop first"]
    for _, (timeout, status) in events[2:]:
        assert 0.0 < timeout <= 5.0 and status == schema.STATUS_RUNNING


def test_a_discarded_session_stops_its_extensions_without_waiting(
        tmp_path: Path, registered: list[extensions.Starter]) -> None:
    timeouts: list[float] = []

    class Stop:
        def stop(self, timeout: float) -> None:
            timeouts.append(timeout)

    def start(config: Config) -> Stop:
        return Stop()

    extensions.register(start)
    registered.append(start)
    otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0).discard()
    assert timeouts == [0.0]


def test_a_failing_extension_costs_only_itself(tmp_path: Path, registered: list[extensions.Starter],
                                               caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[str] = []

    class Fails:
        def stop(self, timeout: float) -> None:
            raise RuntimeError("cannot stop")

    class Works:
        def stop(self, timeout: float) -> None:
            stopped.append("works")

    def broken(config: Config) -> Works:
        raise RuntimeError("cannot start")

    starters: list[extensions.Starter] = [broken, lambda config: Works(), lambda config: Fails()]
    for s in starters:
        extensions.register(s)
    registered += starters
    caplog.set_level(logging.ERROR, logger="otelprof")
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0)
    assert len(session.extensions) == 3  # the periodic schedule, Works, Fails
    with otelprof.step():
        pass
    otelprof.shutdown()
    assert stopped == ["works"]
    assert [r.getMessage() for r in caplog.records] == ["otelprof: an extension did not start",
                                                         "otelprof: an extension did not stop"]
    assert session.run_dir is not None
    assert json.loads((session.run_dir / schema.MANIFEST).read_text())["status"] == schema.STATUS_FINISHED


def test_every_session_runs_the_periodic_profiling_schedule(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0)
    schedule = profile_schedule.of(session)
    otelprof.shutdown()
    assert schedule is not None and schedule._stop.is_set()

