"""Parsing steps.jsonl into a rank: the recorder's own step lines in bulk into
:class:`~otelprof.recording.columns.StepColumns`, any other line as JSON, checked before it is kept."""

from __future__ import annotations

import json
import math
import operator
import re
from array import array
from itertools import accumulate, repeat
from typing import Any

from otelprof.recording import schema
from otelprof.recording.columns import StepColumns
from otelprof.recording.limits import (
    INT64,
    LINE_ERRORS,
    MAX_DURATION_NS,
    MAX_NAMES,
    MAX_STEP_REGIONS,
    MAX_STEP_SCALARS,
    MAX_STRING_CHARS,
    MAX_TIME_NS,
    check_int,
    check_number,
    check_str,
    loads,
    within,
)
from otelprof.recording.ranks import RankRecording
from otelprof.recording.records import Annotation, DeviceTime

_STR = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_INT = r"-?(?:0|[1-9]\d*+)"
_NUM = _INT + r"(?:\.\d++)?+(?:[eE][-+]?\d++)?+"
_REGION = r"\[" + _STR + "," + _INT + "," + _INT + "," + _INT + r"\]"
_SCALAR = _STR + ":(?:" + _NUM + "|" + _STR + ")"
_STEP_LINE = re.compile(
    r'^(?:\{"k":"s","ph":(' + _STR + r'),"n":(' + _INT + r'),"t":(' + _INT + r'),"d":(' + _INT + ')'
    r'(?:,"a":\[(' + _REGION + "(?:," + _REGION + r')*+)\])?+'
    r'(?:,"x":\{(' + _SCALAR + "(?:," + _SCALAR + r')*+)\})?+'
    r'(?:,"err":(' + _STR + r'))?+\}|(.+))$', re.M)
"""A step line exactly as the recorder writes it (groups: phase, number, start, duration, annotations,
scalars, error), or any other line (last group). Every part is unambiguous, so that matching a line
takes time linear in its length whatever it holds. What follows each part cannot continue it, so no part
gives back what it matched: the quantifiers are possessive (``*+``), the same matches with no state kept to
backtrack to (a third faster)."""


def parse_line(line: str, rank: RankRecording) -> None:
    """One steps.jsonl line read as JSON into ``rank`` (the path for lines the bulk parse leaves): a line
    that is not what the recorder writes is skipped and counted."""
    try:
        _parse_step_line(loads(line), rank)
    except LINE_ERRORS:
        rank.skipped_lines += 1


def read_steps(rank: RankRecording, text: str) -> None:
    """One block of steps.jsonl: step columns in bulk straight from the recorder's own line format, or,
    when a line needs it, every line of the block as JSON in file order."""
    rows = _STEP_LINE.findall(text)
    fast = []
    other = []
    bad = 0
    for row in rows:
        if not row[7]:
            fast.append(row)
            continue
        line = row[7].strip()
        if not line:
            continue
        if line.startswith('{"k":"s"') or line.startswith('{"k": "s"'):
            if _is_json(line):
                _read_steps_slowly(rank, text)  # a step in another layout: keep file order
                return
            bad += 1
            continue
        other.append(line)
    if fast:
        columns = StepColumns()
        try:
            done = _fill_columns(columns, fast) and rank.step_columns.extend(columns)
        except LINE_ERRORS:
            done = False
        if not done:
            _read_steps_slowly(rank, text)
            return
    rank.skipped_lines += bad
    for line in other:
        parse_line(line, rank)


def _read_steps_slowly(rank: RankRecording, text: str) -> None:
    for line in text.split("\n"):
        line = line.strip()
        if line:
            parse_line(line, rank)


def _is_json(line: str) -> bool:
    try:
        loads(line)
    except ValueError:
        return False
    return True


def _fill_columns(c: StepColumns, rows: list[tuple[str, ...]]) -> bool:
    """Columns of the recorder's step lines (into an empty ``c``); False when a value is past the reader's
    limits or the bulk parse cannot be sure of the names (the caller then parses the lines as JSON)."""
    phases, numbers, starts, durations, annotations, scalars, errors, _ = zip(*rows)
    phase_names = {token: check_str(loads(token)) for token in dict.fromkeys(phases)}
    if len(phase_names) > MAX_NAMES:
        return False
    phase_codes = {token: c.code(c.phase_names, name) for token, name in phase_names.items()}
    c.phase = array("I", map(phase_codes.__getitem__, phases))
    c.number = _integers(numbers)
    c.start_ns = _integers(starts)
    c.duration_ns = _integers(durations)
    if not (within(c.start_ns, 0, MAX_TIME_NS) and within(c.duration_ns, 0, MAX_DURATION_NS)):
        return False
    # Annotations "[name,offset,duration,depth],...": without backslashes every quote delimits a name,
    # so quotes / 2 counts them, and "],[" separates them: a name holding "],[" changes that count and fails
    # the check. Their tokens are then one flat JSON array: name, offset, duration, depth, name, ...
    joined = ",".join(filter(None, annotations))
    if "\\" in joined:
        return False
    counts = list(map(operator.rshift, map(str.count, annotations, repeat('"')), repeat(1)))
    total = sum(counts)
    if total:
        if max(counts) > MAX_STEP_REGIONS or joined.count("],[") != total - 1:
            return False
        tokens = loads("[" + joined[1:-1].replace("],[", ",") + "]", exact=False)
        if len(tokens) != 4 * total:
            return False
        names = tokens[0::4]
        codes = {}
        for name in dict.fromkeys(names):  # codes in order of first appearance
            if type(name) is not str or len(name) > MAX_STRING_CHARS or len(c.ann_names) >= MAX_NAMES:
                return False
            codes[name] = c.code(c.ann_names, name)
        c.ann_name = array("I", map(codes.__getitem__, names))
        c.ann_offset = array("q", tokens[1::4])  # a number past 64 bits (a float): TypeError, parsed as JSON
        c.ann_duration = array("q", tokens[2::4])
        c.ann_depth = array("i", tokens[3::4])
        if not (within(c.ann_offset, -MAX_DURATION_NS, MAX_DURATION_NS)
                and within(c.ann_duration, 0, MAX_DURATION_NS) and within(c.ann_depth, 0, MAX_STEP_REGIONS)):
            return False
    c.ann_index = array("q", [0])
    c.ann_index.extend(accumulate(counts))
    # Scalars '"name":value,...' (non-finite values as strings "nan", "inf").
    joined = ",".join(filter(None, scalars))
    if "\\" in joined:
        return False
    counts = list(map(str.count, scalars, repeat('":')))
    total = sum(counts)
    if total:
        if max(counts) > MAX_STEP_SCALARS:
            return False
        tokens = joined.replace('":', '",').split(",")
        if len(tokens) != 2 * total:
            return False
        names = tokens[0::2]
        codes = {}
        for token in dict.fromkeys(names):  # codes in order of first appearance
            if not 2 <= len(token) <= MAX_STRING_CHARS + 2 or token[0] != '"' or token[-1] != '"' \
                    or len(c.scalar_names) >= MAX_NAMES:
                return False
            codes[token] = c.code(c.scalar_names, str(json.loads(token)))
        values = tokens[1::2]
        c.scalar_name = array("I", map(codes.__getitem__, names))
        quoted = '":"' in joined  # a value written as a string ("nan", "inf") follows its name so
        c.scalar_value = array("d", map(float, (v.strip('"') for v in values) if quoted else values))
        if not math.isfinite(sum(c.scalar_value)) and (math.inf in c.scalar_value or -math.inf in c.scalar_value) \
                and any(v[:1] != '"' and math.isinf(float(v)) for v in values):
            return False  # a number too large for a double (the recorder writes infinities as "inf")
    c.scalar_index = array("q", [0])
    c.scalar_index.extend(accumulate(counts))
    if any(errors):
        c.errors = {i: check_str(loads(e)) for i, e in enumerate(errors) if e and e != '""'}
    return True


def _integers(tokens: tuple[str, ...]) -> array[int]:
    """Integer tokens (``_INT``) as 64-bit integers: one JSON array (OverflowError or TypeError past 64 bits)."""
    return array("q", loads("[" + ",".join(tokens) + "]", exact=False))


def _parse_step_line(data: Any, rank: RankRecording) -> None:
    """One steps.jsonl record (format in :mod:`otelprof.recording.schema`), checked before anything of it
    is kept: ValueError (or another of LINE_ERRORS) when it is not what the recorder writes."""
    if type(data) is not dict:
        raise ValueError("not an object")
    kind = data["k"]
    if kind == schema.KIND_STEP:
        regions = data.get("a") or ()
        scalars = data.get("x") or {}
        if len(regions) > MAX_STEP_REGIONS or type(scalars) is not dict or len(scalars) > MAX_STEP_SCALARS:
            raise ValueError("too many regions or scalars")
        annotations = [(check_str(name), check_int(offset, -MAX_DURATION_NS, MAX_DURATION_NS),
                        check_int(dur, 0, MAX_DURATION_NS), check_int(depth, 0, MAX_STEP_REGIONS))
                       for name, offset, dur, depth in regions]
        values = {check_str(k): check_number(v) for k, v in scalars.items()}
        error = data.get("err")
        rank.step_columns.append(check_str(data["ph"]), check_int(data["n"], -INT64 - 1, INT64),
                                 check_int(data["t"], 0, MAX_TIME_NS), check_int(data["d"], 0, MAX_DURATION_NS),
                                 annotations, values, check_str(error) if error is not None else None)
    elif kind == schema.KIND_ANNOTATION:
        phase = data.get("ph")
        rank.annotations.append(Annotation(check_str(data["name"]), check_int(data["t"], 0, MAX_TIME_NS),
                                           check_int(data["d"], 0, MAX_DURATION_NS), 0,
                                           check_str(phase) if phase is not None else None))
    elif kind == schema.KIND_SCALAR:
        phase = data.get("ph")
        rank.scalars.append((check_int(data["t"], 0, MAX_TIME_NS), check_str(phase) if phase is not None else "None",
                             check_str(data["name"]), check_number(data["v"])))
    elif kind == schema.KIND_PHASE:
        rank.phases.append((check_int(data["t"], 0, MAX_TIME_NS), check_str(data["ph"])))
    elif kind == schema.KIND_DEVICE:
        number = check_int(data["n"], -INT64 - 1, INT64) if data.get("n") is not None else None
        phase = check_str(data["ph"])
        regions = data["a"]
        if type(regions) is not list or len(regions) > MAX_STEP_REGIONS:
            raise ValueError("not a list of regions")
        rank.device_times.extend([DeviceTime(phase, number, name, duration) for name, duration in
                                  [(check_str(n), check_int(d, 0, MAX_DURATION_NS)) for n, d in regions]])
    else:
        raise ValueError(f"unknown record kind {kind!r:.40}")
