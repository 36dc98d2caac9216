"""Bounded label cardinality: the series count does not grow with steps, and names past the cap fold
into `other` (the scale note in deploy/README.md depends on it)."""

from __future__ import annotations

from pathlib import Path

import otelprof
from otelprof import semconv as sc
from otelprof.runtime.export.prometheus import render


def _series(session: otelprof.Session) -> list[str]:
    """Series identities (name and labels, without the value)."""
    text = render(session.registry.collect(), {})
    return [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith(("#", "target_info"))]


# Counters that appear the first time their (bounded) event happens: an outlier, a span reason.
LAZY = (sc.STEP_OUTLIERS.prometheus_name + "_total", sc.SPANS_BUILT.prometheus_name + "_total")


def test_series_do_not_grow_with_steps_and_names_are_capped(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, max_label_values=8)
    assert isinstance(session, otelprof.Session)

    def run(steps: int, names: int, phases: int) -> None:
        for i in range(steps):
            with otelprof.step(phase=f"phase{i % phases}"):
                with otelprof.annotate(f"region{i % names}"):
                    pass
                otelprof.record("loss", 1.0)

    run(100, 4, 2)
    small = set(_series(session))
    run(2000, 4, 2)
    grown = set(_series(session)) - small
    assert all(line.startswith(LAZY) for line in grown), grown  # more steps, same series
    run(2000, 500, 40)  # hundreds of names: capped
    series = _series(session)
    phases = {line.split('phase="')[1].split('"')[0] for line in series if 'phase="' in line}
    annotations = {line.split('annotation="')[1].split('"')[0] for line in series if 'annotation="' in line}
    assert len(phases) <= 8 + 2 and sc.OTHER_LABEL_VALUE in phases  # the cap, "other", and "none"
    assert len(annotations) <= 8 + 1 and sc.OTHER_LABEL_VALUE in annotations
    # no label carries a step number
    assert not any(f'"{n}"' in line for line in series for n in ("1999", "3999"))
