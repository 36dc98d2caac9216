"""A small, deterministic YAML writer for the generated files (dicts, lists, strings, numbers).

Output is stable across machines (no PyYAML version differences in committed files).
Strings are plain when unambiguous, block literals when multi-line, else double-quoted
(JSON escaping, which YAML's double-quoted style accepts).
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@()=+,\-]*( [A-Za-z0-9_./@()=+,\-]+)*$")
_DURATION = re.compile(r"^\d+(ms|s|m|h|d|w|y)$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if (_PLAIN.match(text) and text.lower() not in _RESERVED) or _DURATION.match(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        for key, item in value.items():
            out.extend(_entry(pad + scalar(key) + ":", item, indent))
        return out
    if isinstance(value, (list, tuple)):
        if not value:
            return [pad + "[]"]
        for item in value:
            if isinstance(item, dict) and item:
                inner = _lines(item, indent + 2)
                out.append(pad + "- " + inner[0].lstrip())
                out.extend(inner[1:])
            else:
                out.extend(_entry(pad + "-", item, indent))
        return out
    return [pad + scalar(value)]


def _entry(head: str, item: Any, indent: int) -> list[str]:
    if isinstance(item, str) and "\n" in item:
        body = item.rstrip("\n")
        if all(line == line.rstrip() for line in body.split("\n")):
            chomp = "" if item.endswith("\n") else "-"
            return [f"{head} |{chomp}", *((" " * (indent + 2) + line) if line else "" for line in body.split("\n"))]
        return [f"{head} {scalar(item)}"]
    if isinstance(item, dict) and item:
        return [head, *_lines(item, indent + 2)]
    if isinstance(item, (list, tuple)) and item:
        return [head, *_lines(item, indent + 2)]
    return [f"{head} {_lines(item, 0)[0]}"]


def dump(value: Any, header: str = "") -> str:
    """``value`` as a YAML document, with ``header`` as leading comment lines."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + "\n".join(_lines(value, 0)) + "\n"
