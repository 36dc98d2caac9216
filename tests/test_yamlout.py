"""The generated files' YAML writer round-trips: what PyYAML reads back is what was written."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otelprof.mixin import yamlout

_TOKENS = st.sampled_from([
    "", " ", "~", "=", "null", "Null", "NULL", "true", "True", "yes", "No", "on", "OFF", "y", "n", "-", "- x",
    "? x", ": x", "x: y", "x #y", "#x", "&a", "*a", "!tag", "|", ">", "'", '"', "%YAML", "@x", "`x", "---", "...",
    "{}", "[]", "{a: 1}", "1", "-1", "0x1f", "0o17", "017", "1_000", "1.5", ".5", "1e3", "1.0e+3", ".inf",
    "-.Inf", ".NaN", "2026-11-25", "12:30:45", "5m", "1y", "<<", "\ufeffx", "a\u2028b", "a\x85b", "\x7f",
    "\x00", "\t", "x\n", "x\n\n", "\n", "\nx", " x\ny", "x \ny", "x\n y", "\tx\ny", "x\r\ny", "é\nü", "😀\n1",
])
_TEXT = st.one_of(_TOKENS, st.text(max_size=40), st.text(alphabet=" \n\t:#-x'\"|>", max_size=20))
_KEYS = st.one_of(_TOKENS, st.text(max_size=30))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(),
                     st.floats(allow_nan=False), _TEXT)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=12)


@settings(max_examples=1000, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(_VALUES)
@example({"e": "line1\nline2\n\n", "f": "  indented\nfirst line", "g": ["x\n"], "h": {"k": "\n"}})
def test_round_trip(value: Any) -> None:
    text = yamlout.dump(value, "a header\n\nwith a blank line")
    assert yaml.safe_load(text) == value, text


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.floats(allow_nan=False))
def test_floats_stay_floats(value: float) -> None:
    loaded = yaml.safe_load(yamlout.dump({"v": value}))["v"]
    assert isinstance(loaded, float) and loaded == value


def test_nan_is_yaml_nan() -> None:
    loaded = yaml.safe_load(yamlout.dump([float("nan")]))[0]
    assert loaded != loaded
