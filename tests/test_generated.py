"""Generated files are current: a stale README table fails here (fix: otelprof generate)."""

from __future__ import annotations

from pathlib import Path

from otelprof.generate import render_readme

ROOT = Path(__file__).resolve().parent.parent


def test_readme_tables_are_current() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert render_readme(text) == text, "README tables are stale: run `otelprof generate`"


def test_readme_starts_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text(encoding="utf-8")[:800]
    assert "make demo" in head and "make test" in head
