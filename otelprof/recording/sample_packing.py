"""Sample blocks of schema 1.3: per-CPU values reduced by the writer, numeric columns packed in binary.

A block line is one JSON object::

    {"k":"b","t":"<int64 x n>","pid":pid,"c":[column,...],"gpu":{index:[key,...]},"same":[position,...],
     "sv":"<float64 x len(same)>","v":"<float64 x n x (width - len(same))>","ncpu":k,"busy":"<float64 x cores>",
     "niow":k,"iowait":"<float64 x cores>"}

where ``"<type x count>"`` is base64 of that many little-endian values. ``t`` holds the ``n`` sample times
(Unix ns). ``c`` names the block's columns of a value per sample (:data:`COLUMNS`: the sample keys ``pcpu``,
``rss``, ``mem``, ``thr``, ``cws``, ``cml``; ``cpum``/``cpux`` the mean and the maximum of a sample's per-CPU busy
ratios, ``iowm``/``iowx`` of its per-CPU iowait ratios; ``dr``/``dw`` and ``nr``/``nt`` the ``disk`` and ``net``
pairs), ``gpu`` the keys of each GPU. ``v`` holds the samples one after the other, each its ``width`` values in
that order (``c``'s, then each GPU's), NaN where a sample lacks one; but for the columns at the positions
``same`` (ascending), whose one value ``sv`` has: a column the writer has seen with one value in every sample
since it started (a memory total, a power limit) is written once a block (bitwise: -0.0 is not 0.0), until it
varies. ``ncpu`` is how many of the samples had
per-CPU busy values and ``busy``, per logical CPU, the sum of their busy ratios; ``niow``/``iowait`` the same for
iowait (a per-CPU view at the block's resolution). ``pid`` is one number when every sample has the same (a list
otherwise). Keys without values are left out.

The mean is ``sum(values, 0.0) / len(values)`` and the maximum ``max(values)`` of the rounded values the sampler
gives: what the reader computed from a 1.2 line, the same doubles. A per-CPU sum is the block's samples added
in order from 0.0; the reader adds the blocks' sums, so a rank's ``core_busy_sum`` is
``(...(b1 + b2) + ...)`` instead of ``(...(s1 + s2) + ...)`` over the samples: the two orders of adding ``N``
numbers ``s_i`` (``N`` samples of the rank) differ by at most ``2 (N - 1) u sum|s_i|`` (``u`` = 2**-53, the
rounding of a double; recursive summation's error bound, once per order), a relative ``3.2e-12`` for a node's
14,400 samples of 2 hours: the 12th significant digit of a per-CPU mean.

Reading a block costs a few calls in C whatever its size: base64 decoded, the bytes taken into arrays
(``frombytes``; swapped on a big-endian machine), their lengths checked against the names, no infinity (a byte
search; NaN is a missing value), the reader's limits on samples, GPUs, keys and CPUs. Anything else raises
ValueError, TypeError, KeyError or OverflowError before anything is kept."""

from __future__ import annotations

import base64
import binascii
import math
import operator
import sys
from array import array
from collections.abc import Callable
from functools import partial
from itertools import chain
from typing import Any, NamedTuple

from otelprof.recording.limits import MAX_CORES, MAX_GPU_KEYS, MAX_GPUS, MAX_STRING_CHARS, MAX_TIME_NS, within

MAX_BLOCK_SAMPLES = 10_000
"""Samples in one block line the reader accepts."""

COLUMNS = {"pcpu": "pcpu", "rss": "rss", "mem": "mem", "thr": "throttled", "cws": "container_memory",
           "cml": "container_limit", "cpum": "cpu_mean", "cpux": "cpu_max", "iowm": "iow_mean", "iowx": "iow_max",
           "dr": "disk_read", "dw": "disk_write", "nr": "net_rx", "nt": "net_tx"}
"""A block's columns of a value per sample -> the :class:`~otelprof.recording.columns.SampleColumns` field each
fills."""
_SCALARS = frozenset(("pcpu", "rss", "mem", "thr", "cws", "cml"))
_PROCESS_KEYS = frozenset(("t", "pid", "pcpu", "rss"))
_PAIRS = {"disk": ("dr", "dw"), "net": ("nr", "nt")}
_GPU_NUMBER = {int, float, bool}
_BIG = sys.byteorder == "big"
try:
    b64decode: Callable[[str], bytes] = partial(binascii.a2b_base64, strict_mode=True)  # type: ignore[call-arg]
    b64decode("")
except TypeError:  # before Python 3.11: the alphabet checked by a regular expression first
    b64decode = partial(base64.b64decode, validate=True)
"""Base64 to bytes, refusing (binascii.Error, a ValueError) any character outside the alphabet and bad padding."""
_INFINITIES = (b"\x00\x00\x00\x00\x00\x00\xf0\x7f", b"\x00\x00\x00\x00\x00\x00\xf0\xff")
"""+inf and -inf as little-endian doubles."""


class Packer:
    """A block's samples as the writer holds them until it packs them: per sample its values in the order of its
    layout (its columns and GPU keys), per-CPU values reduced (:meth:`add` raises TypeError, ValueError or
    OverflowError for a value that is not a number, keeping nothing of that sample)."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self._pids: list[int | None] = []
        self._layouts: list[_Layout] = []
        self._rows: list[list[float]] = []
        self._busy: list[float] = []
        self._iowait: list[float] = []
        self._ncpu = 0
        self._niow = 0
        self.cores = 0
        """Values of the per-CPU sums held."""

    def add(self, sample: dict[str, Any]) -> int:
        """Hold one sample (a record as the sampler makes it); the number of values it adds to the block."""
        t = sample["t"]
        if type(t) is not int or not 0 <= t <= MAX_TIME_NS:
            raise ValueError("not a sample time")
        cpu = iow = None
        if sample.keys() <= _PROCESS_KEYS:  # a process's sample (most ranks of a large job)
            pcpu, rss = sample.get("pcpu"), sample.get("rss")
            row = [pcpu if type(pcpu) is float else _double(pcpu), rss if type(rss) is float else _double(rss)]
            layout = _PROCESS
        else:
            layout, row, cpu, iow = _node_sample(sample)
        # nothing raises past here
        pid = sample.get("pid")
        self.times.append(t)
        self._pids.append(pid if type(pid) is int else None)
        self._layouts.append(layout)
        self._rows.append(row)
        if cpu is not None:
            self._ncpu += 1
            self._busy = _summed(self._busy, cpu)
        if iow is not None:
            self._niow += 1
            self._iowait = _summed(self._iowait, iow)
        self.cores = len(self._busy) + len(self._iowait)
        return len(row)

    def pack(self, kept: dict[tuple[str, str], bytes] | None = None) -> dict[str, Any]:
        """The held samples as a block record (without its ``k``). ``kept``: per column (``("", name)`` or
        ``(index, key)``) the value it has had in every sample of the blocks before, or ``b""`` once it varied
        (updated): such a column, the same in every sample of this block too, is written once."""
        block: dict[str, Any] = {"t": _pack(array("q", self.times))}
        pids = set(self._pids)
        if len(pids) > 1:
            block["pid"] = self._pids
        elif None not in pids:
            block["pid"] = self._pids[0]
        layouts, rows = self._layouts, self._rows
        if layouts.count(layouts[0]) == len(layouts):  # the same columns in every sample: its rows as they are
            (names, gpus), flat = layouts[0], list(chain.from_iterable(rows))
        else:
            names, gpus, flat = _merged(layouts, rows)
        if names:
            block["c"] = list(names)
        if gpus:
            block["gpu"] = {index: list(keys) for index, keys in gpus}
        values = array("d", flat)
        if values and kept is not None:
            values = _kept_apart(block, values, names, gpus, len(self.times), kept)
        if values:
            block["v"] = _pack(values)  # sample after sample
        if self._ncpu:
            block["ncpu"], block["busy"] = self._ncpu, _pack(array("d", self._busy))
        if self._niow:
            block["niow"], block["iowait"] = self._niow, _pack(array("d", self._iowait))
        return block


def _kept_apart(block: dict[str, Any], values: array[float], names: tuple[str, ...], gpus: Any, n: int,
               kept: dict[tuple[str, str], bytes]) -> array[float]:
    """The columns of ``values`` (``n`` samples of the layout ``names``, ``gpus``) that have had one value in every
    sample so far, written once (``same``: their positions, ``sv``: their values); the others' values."""
    positions = [("", name) for name in names] + [(index, key) for index, keys in gpus for key in keys]
    width = len(positions)
    same = []
    for j, position in enumerate(positions):
        first = kept.get(position)
        if first == b"":
            continue  # varied before
        column = values[j::width].tobytes()
        if column != column[:8] * n or (first is not None and first != column[:8]):
            kept[position] = b""  # bitwise: -0.0 is not 0.0, NaN is NaN
            continue
        kept[position] = column[:8]
        same.append(j)
    if not same:
        return values
    block["same"] = same
    block["sv"] = _pack(array("d", [values[j] for j in same]))
    apart = set(same)
    varying = [j for j in range(width) if j not in apart]
    if not varying:
        return array("d")
    return array("d", chain.from_iterable(zip(*(values[j::width] for j in varying))))


_Layout = tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]
"""A sample's columns (names of :data:`COLUMNS`) and its GPUs' keys, in the order of its values."""
_PROCESS: _Layout = (("pcpu", "rss"), ())


def _node_sample(sample: dict[str, Any]) -> tuple[_Layout, list[float], list[Any] | None, list[Any] | None]:
    """A sample with node values: its layout, its values, its per-CPU busy and iowait lists (checked)."""
    values: dict[str, float] = {}
    cpu = iow = None
    gpus: tuple[tuple[str, tuple[str, ...]], ...] = ()
    gpu_values: list[float] = []
    for key, value in sample.items():
        if key in _SCALARS:
            if value is not None:
                values[key] = value if type(value) is float else _double(value)
        elif key == "cpu":
            cpu = value or None
        elif key == "iow":
            iow = value or None
        elif key in _PAIRS:
            if value:
                a, b = value
                first, second = _PAIRS[key]
                values[first], values[second] = _double(a), _double(b)
        elif key == "gpu" and value:
            for index, entry in value.items():
                if type(index) is not str or not set(map(type, entry)) <= {str} \
                        or not set(map(type, entry.values())) <= _GPU_NUMBER:
                    raise TypeError("not a GPU's numbers")
                gpu_values += map(float, entry.values())
            gpus = tuple(zip(value, map(tuple, value.values())))
    if cpu is not None:  # the reader's arithmetic on a 1.2 line: the same doubles
        values["cpum"], values["cpux"] = sum(cpu, 0.0) / len(cpu), float(max(cpu))  # TypeError: not numbers
    if iow is not None:
        values["iowm"], values["iowx"] = sum(iow, 0.0) / len(iow), float(max(iow))
    return (tuple(values), gpus), [*values.values(), *gpu_values], cpu, iow


def _merged(layouts: list[_Layout], rows: list[list[float]]) -> tuple[tuple[str, ...], Any, list[float]]:
    """Samples of different layouts: every column any of them has, NaN where one lacks it."""
    names = tuple(dict.fromkeys(chain.from_iterable(layout[0] for layout in layouts)))
    keys: dict[str, dict[str, None]] = {}
    for layout in layouts:
        for index, found in layout[1]:
            keys.setdefault(index, {}).update(dict.fromkeys(found))
    order = [("", name) for name in names] + [(index, key) for index, found in keys.items() for key in found]
    flat: list[float] = []
    for (own, gpus), row in zip(layouts, rows):
        where = [("", name) for name in own] + [(index, key) for index, found in gpus for key in found]
        at = dict(zip(where, row))
        flat += [at.get(position, math.nan) for position in order]
    return names, tuple((index, tuple(found)) for index, found in keys.items()), flat


def _double(value: Any) -> float:
    """A sample's number as a double (None: NaN)."""
    if value is None:
        return math.nan
    if type(value) not in (int, float):
        raise TypeError(f"not a number: {value!r:.40}")
    return float(value)


def _summed(sums: list[float], values: list[Any]) -> list[float]:
    """``sums`` (per CPU) with ``values`` (numbers, checked) added, as the reader adds a sample's."""
    if len(values) > len(sums):
        sums.extend([0.0] * (len(values) - len(sums)))
    sums[:len(values)] = map(operator.add, sums, values)
    return sums


def _pack(values: array[Any]) -> str:
    if _BIG:
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unpack(text: Any, typecode: str) -> array[Any]:
    """The values of a packed field: base64 of little-endian values, a whole number of them, none of them
    an infinity."""
    if type(text) is not str:
        raise TypeError("not a packed field")
    raw = b64decode(text)
    if typecode == "d" and not _finite(raw):
        raise ValueError("an infinite value")
    values = array(typecode)
    values.frombytes(raw)  # ValueError for a length that is not a whole number of values
    if _BIG:
        values.byteswap()
    return values


def _finite(raw: bytes) -> bool:
    """Whether none of the little-endian doubles in ``raw`` is an infinity (searches in C: no value's last byte
    can start an infinity or a NaN, which most often is so; else the infinities' bytes, where a match that is not
    at a value's start is bytes of two values)."""
    last = raw[7::8]
    if b"\x7f" not in last and b"\xff" not in last:
        return True
    for infinity in _INFINITIES:
        at = raw.find(infinity)
        while at >= 0:
            if at % 8 == 0:
                return False
            at = raw.find(infinity, at + 1)
    return True


_BELOW_2_62 = bytes(range(0x40))
"""The last bytes of the little-endian int64 values from 0 to 2**62 - 1."""


def times_within(t_ns: array[int]) -> bool:
    """Whether every time lies in 0..MAX_TIME_NS (in C: the last bytes of the values, then their range)."""
    if _BIG or MAX_TIME_NS != 2**62:
        return within(t_ns, 0, MAX_TIME_NS)
    return not memoryview(t_ns).cast("B")[7::8].tobytes().translate(None, _BELOW_2_62) \
        or within(t_ns, 0, MAX_TIME_NS)


class Unpacked(NamedTuple):
    """A checked block: its times, its columns (:data:`COLUMNS` names), its GPUs' columns, and per CPU the sums
    of busy and iowait ratios with how many samples they add up."""

    t_ns: array[int]
    columns: dict[str, array[float]]
    gpus: dict[str, dict[str, array[float]]]
    ncpu: int
    busy: array[float]
    niow: int
    iowait: array[float]


def unpack(block: dict[str, Any], known: dict[str, dict[str, array[float]]]) -> Unpacked:
    """A 1.3 block record, checked whole (``known``: the rank's GPUs so far, for the per-rank limits)."""
    t_ns = _unpack(block["t"], "q")
    n = len(t_ns)
    if not 0 < n <= MAX_BLOCK_SAMPLES or not times_within(t_ns):
        raise ValueError("not a block's sample times")
    names, gpus = block.get("c", []), block.get("gpu", {})
    width = layout_width(names, gpus, known)
    same, kept = _same(block, width)
    values = _unpack(block.get("v", ""), "d")
    varying = width - len(same)
    if len(values) != n * varying:
        raise ValueError(f"not {varying} columns of {n} values")
    ncpu, busy = _sums(block, "ncpu", "busy", n)
    niow, iowait = _sums(block, "niow", "iowait", n)
    full: list[array[float]] = []
    at = 0
    for j in range(width):
        if j in same:
            full.append(array("d", [kept[same[j]]]) * n)
        else:
            full.append(values[at::varying])
            at += 1
    columns = dict(zip(names, full))
    at = len(names)
    out: dict[str, dict[str, array[float]]] = {}
    for index, keys in gpus.items():
        out[index] = dict(zip(keys, full[at:at + len(keys)]))
        at += len(keys)
    return Unpacked(t_ns, columns, out, ncpu, busy, niow, iowait)


def layout_width(names: Any, gpus: Any, known: dict[str, dict[str, array[float]]]) -> int:
    """Values per sample of a block with columns ``names`` and GPU keys ``gpus`` (its ``c`` and ``gpu``), checked
    against the reader's limits with the rank's GPUs so far (``known``); ValueError or TypeError otherwise."""
    if type(names) is not list or not set(names) <= COLUMNS.keys() or len(set(names)) != len(names):
        raise ValueError("not a block's columns")
    if type(gpus) is not dict or len(gpus) > MAX_GPUS or len(known.keys() | gpus.keys()) > MAX_GPUS:
        raise ValueError(f"not an object of at most {MAX_GPUS} GPUs")
    width = len(names)
    for index, keys in gpus.items():
        if type(keys) is not list or not set(map(type, keys)) <= {str} or len(set(keys)) != len(keys) \
                or len(index) > 64 or sum(map(len, keys)) > MAX_STRING_CHARS or len(keys) > MAX_GPU_KEYS \
                or len(known.get(index, {}).keys() | set(keys)) > MAX_GPU_KEYS:
            raise ValueError("not a GPU's keys")
        width += len(keys)
    return width


def same_positions(value: Any, width: int) -> list[int]:
    """A block's ``same``: positions of columns, ascending, each below ``width``; ValueError otherwise."""
    if type(value) is not list or not set(map(type, value)) <= {int} \
            or (value and not (value[0] >= 0 and value[-1] < width)) or any(map(operator.ge, value, value[1:])):
        raise ValueError("not positions of columns")
    return value


def _same(block: dict[str, Any], width: int) -> tuple[dict[int, int], array[float]]:
    """The columns written once (position -> index into their values) and their values."""
    positions = same_positions(block.get("same", []), width)
    values = _unpack(block.get("sv", ""), "d")
    if len(values) != len(positions):
        raise ValueError("not a value per column written once")
    return {j: i for i, j in enumerate(positions)}, values


def _sums(block: dict[str, Any], count: str, key: str, n: int) -> tuple[int, array[float]]:
    """How many samples had per-CPU values (0..n) and their per-CPU sums (1..MAX_CORES of them; none without)."""
    samples = block.get(count, 0)
    sums = _unpack(block.get(key, ""), "d")
    if type(samples) is not int or not 0 <= samples <= n or len(sums) > MAX_CORES or (samples > 0) != (len(sums) > 0):
        raise ValueError("not per-CPU sums")
    return samples, sums


def samples_of(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A 1.3 block record's samples as sample records (numbers as doubles; a missing value left out): the
    reduced per-CPU values as ``cpum``, ``cpux``, ``iowm``, ``iowx``, the block's per-CPU sums (``ncpu``,
    ``busy``, ``niow``, ``iowait`` as lists) with its last sample."""
    found = unpack(block, {})
    n = len(found.t_ns)
    pid = block.get("pid")
    if type(pid) is list and len(pid) != n:
        raise ValueError("not a process id per sample")
    samples: list[dict[str, Any]] = [
        {"t": t} if pid is None else {"t": t, "pid": pid[i] if type(pid) is list else pid}
        for i, t in enumerate(found.t_ns)]
    for name, column in found.columns.items():
        for sample, value in zip(samples, column):
            if value == value:
                sample[name] = value
    for key, (first, second) in _PAIRS.items():
        for sample in samples:
            a, b = sample.pop(first, None), sample.pop(second, None)
            if a is not None or b is not None:
                sample[key] = [a, b]
    for index, entry in found.gpus.items():
        for key, column in entry.items():
            for sample, value in zip(samples, column):
                if value == value:
                    sample.setdefault("gpu", {}).setdefault(index, {})[key] = value
    last = samples[n - 1]
    if found.ncpu:
        last["ncpu"], last["busy"] = found.ncpu, found.busy.tolist()
    if found.niow:
        last["niow"], last["iowait"] = found.niow, found.iowait.tolist()
    return samples
