"""A small, deterministic YAML writer for the generated files (dicts, lists, strings, numbers, bools, None).

Output is stable across machines (no PyYAML version differences in committed files) and round-trips:
``yaml.safe_load(dump(x)) == x`` for every string (tests/test_yamlout.py fuzzes it). Strings are plain when
unambiguous, block literals when multi-line and safe to write so, else double-quoted (JSON escaping, which
YAML's double-quoted style accepts, plus escapes for what YAML may not carry raw or would fold). Mapping
keys are written as implicit keys, so a key must stay under YAML's 1024-character limit for them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@()=+,\-]*( [A-Za-z0-9_./@()=+,\-]+)*$")
_DURATION = re.compile(r"^\d+(ms|s|m|h|d|w|y)$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~", "="}
# What YAML may not carry raw (not printable, a byte-order mark) or reads as a line break (folded in
# quoted scalars): escaped as \uXXXX / \UXXXXXXXX, which double-quoted YAML accepts.
_UNSAFE = re.compile("[^\t\n\x20-\x7e\xa0-\u2027\u202a-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")
_BLOCK_UNSAFE = re.compile("[^\n\x20-\x7e\xa0-\u2027\u202a-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:  # YAML 1.1 floats need a dot: 1e+20 -> 1.0e+20
        text = f"{mantissa}.0e{exponent}"
    return text


def scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    text = str(value)
    if (_PLAIN.fullmatch(text) and text.lower() not in _RESERVED) or _DURATION.fullmatch(text):
        return text
    return _UNSAFE.sub(_escape, json.dumps(text, ensure_ascii=False))


def _block_safe(text: str) -> bool:
    """Whether ``text`` reads back unchanged from a clipped (``|``) or stripped (``|-``) block literal."""
    body = text[:-1] if text.endswith("\n") else text
    lines = body.split("\n")
    return (len(lines) > 1 and lines[0][:1] not in ("", " ") and not body.endswith("\n")
            and all(line == line.rstrip() for line in lines) and not _BLOCK_UNSAFE.search(body))


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
    if isinstance(item, str) and "\n" in item and _block_safe(item):
        chomp = "" if item.endswith("\n") else "-"
        body = item[:-1] if item.endswith("\n") else item
        return [f"{head} |{chomp}", *((" " * (indent + 2) + line) if line else "" for line in body.split("\n"))]
    if isinstance(item, dict) and item:
        return [head, *_lines(item, indent + 2)]
    if isinstance(item, (list, tuple)) and item:
        return [head, *_lines(item, indent + 2)]
    return [f"{head} {_lines(item, 0)[0]}"]


def dump(value: Any, header: str = "") -> str:
    """``value`` as a YAML document, with ``header`` as leading comment lines."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + "\n".join(_lines(value, 0)) + "\n"
