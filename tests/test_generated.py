"""The README and docs/: generated tables are current (fix: otelprof generate), the README stays a front door,
and every relative link points to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otelprof.cli.generate import DOC_BLOCKS, render_blocks

ROOT = Path(__file__).resolve().parent.parent
README_MAX_BYTES = 40_000
PROJECT_FILES = "https://github.com/otelprof/otelprof/blob/main/"
"""Where the project's files are published ([project.urls] in pyproject.toml)."""
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_CODE = re.compile(r"`[^`\n]*`")


@pytest.mark.parametrize("relative", sorted(DOC_BLOCKS))
def test_generated_tables_are_current(relative: str) -> None:
    text = (ROOT / relative).read_text(encoding="utf-8")
    assert render_blocks(text, DOC_BLOCKS[relative]) == text, f"{relative} is stale: run `otelprof generate`"


def test_a_stale_table_is_caught() -> None:
    text = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    stale = text.replace("| `OTELPROF_RECORD` |", "| `OTELPROF_RECORD_OLD` |", 1)
    assert stale != text
    assert render_blocks(stale, DOC_BLOCKS["docs/configuration.md"]) == text


def test_readme_starts_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text(encoding="utf-8")[:800]
    assert "make demo" in head and "make test" in head


def test_readme_is_a_front_door() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size < README_MAX_BYTES, f"README.md is {size} bytes: move detail into docs/"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    anchors: set[str] = set()
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def _links(path: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return _LINK.findall(text)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document: Path) -> None:
    broken = []
    for link in _links(document):
        if link.startswith(PROJECT_FILES):  # the README's links, absolute for the package index
            target, _, anchor = link.removeprefix(PROJECT_FILES).partition("#")
            path = ROOT / target
        elif re.match(r"^[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
            continue
        else:
            target, _, anchor = link.partition("#")
            path = (document.parent / target).resolve() if target else document
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{document.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_links_into_the_project_absolutely() -> None:
    """The README is also the package index's page, where relative links are dead."""
    links = _links(ROOT / "README.md")
    relative = [link for link in links if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", link)]
    assert not relative, relative
    assert any(link.startswith(PROJECT_FILES) for link in links)


def test_the_link_checker_sees_links_and_anchors() -> None:
    links = _links(ROOT / "README.md")
    assert PROJECT_FILES + "docs/security.md" in links and "#security-and-failure-behaviour" in links
    assert "on-demand-capture-and-stop" in _anchors(ROOT / "docs/pytorch.md")
    assert "the-hooks-in-c" in _anchors(ROOT / "docs/pytorch.md")
    assert "otelprof-report" in _anchors(ROOT / "docs/report.md")
