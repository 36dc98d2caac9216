"""A corpus of malformed recordings, generated (nothing large is committed): every case is a mutation of
one real small recording that two processes write through the explicit API (``record_base``).

``CASES`` maps a case name to the mutation it makes of a copy of the run directory and to what the
offline tools must make of it:

* ``ERROR``: the recording cannot be read (a manifest that is not the writer's, a recording file that is
  not a regular file, two directories holding one rank): a one-line error and exit 2;
* ``SKIPS``: lines are unusable (truncated, corrupt, past the reader's limits): they are skipped, the
  output says how many, the exit code is the tools' usual one;
* ``ANY``: either (a value the reader may accept or refuse).

Not a test module: the tests import it.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otelprof.recording import limits, schema
from otelprof.recording.sample_blocks import decode, encode
from tests.sample_records import sample_records

ERROR, SKIPS, ANY = "error", "skips", "any"
RUN_ID = "corpus-run"
ROOT = Path(__file__).resolve().parent.parent

_WRITE = """
import sys, time
import otelprof
record_dir, rank, RUN_ID = sys.argv[1], int(sys.argv[2]), sys.argv[3]
otelprof.init(job_name="corpus", record_dir=record_dir, run_id=RUN_ID, rank=rank, local_rank=rank, world_size=2,
              sample_interval=0.1)
with otelprof.annotate("initialization"):
    time.sleep(0.01)
for i in range(40):
    with otelprof.step():
        with otelprof.annotate("dataloader"):
            time.sleep(0.001)
        with otelprof.annotate("forward"):
            with otelprof.annotate("attention"):
                time.sleep(0.002)
        with otelprof.annotate("backward"):
            time.sleep(0.002)
        otelprof.record("loss", 2.0 / (i + 1))
        otelprof.record("samples", 32)
for i in range(5):
    with otelprof.step(phase="eval"):
        time.sleep(0.002)
otelprof.record("epoch", 1)
time.sleep(0.25)
otelprof.shutdown()
"""


def record_base(record_dir: Path) -> Path:
    """Record the base run (ranks 0 and 1, rank 0 sampling the node) in two clean processes; returns the
    run directory. A device-time line and an operator-profiling window in the writer's formats are
    added (they need CUDA and torch.profiler to be written for real)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "TORCHELASTIC"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "KUBERNETES_SERVICE_HOST")}
    env["PYTHONPATH"] = str(ROOT)
    processes = [subprocess.Popen([sys.executable, "-c", _WRITE, str(record_dir), str(rank), RUN_ID], env=env,
                                  stderr=subprocess.DEVNULL) for rank in (0, 1)]
    assert [p.wait(120) for p in processes] == [0, 0]
    run = record_dir / RUN_ID
    rank0 = run / "rank-0"
    steps = (rank0 / schema.STEPS).read_text().splitlines()
    first = json.loads(next(line for line in steps if line.startswith('{"k":"s"')))
    with open(rank0 / schema.STEPS, "a") as out:
        out.write(json.dumps({"k": "d", "ph": "train", "n": first["n"], "a": [["forward", 1_200_000]]},
                             separators=(",", ":")) + "\n")
    window = {"start_step": 2, "num_steps": 3, "t": first["t"], "d": 30_000_000,
              "cpu_ops": [{"name": "aten::addmm", "calls": 6, "self_s": 0.004, "total_s": 0.006}],
              "gpu_ops": [{"name": "void gemm_kernel<float>", "calls": 6, "self_s": 0.003, "total_s": 0.003}],
              "gpu_activity_s": {"kernel": 0.003}, "kernel_precision_s": {"fp32": 0.003}}
    (rank0 / schema.PROFILES).write_text(json.dumps(window) + "\n")
    for name in (schema.STEPS, schema.SPANS, schema.METRICS, schema.SAMPLES):
        assert (rank0 / name).stat().st_size > 0, name
    return run


@dataclass(frozen=True)
class Case:
    mutate: Callable[[Path], None]
    """Changes a copy of the run directory."""
    expect: str


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def _append(file: str, *lines: str | bytes) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        with open(run / "rank-0" / file, "ab") as out:
            for line in lines:
                out.write((line.encode() if isinstance(line, str) else line) + b"\n")
    return mutate


def _write(file: str, content: bytes) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        (run / "rank-0" / file).write_bytes(content)
    return mutate


def _remove(file: str) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        (run / "rank-0" / file).unlink()
    return mutate


def _directory(file: str) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        path = run / "rank-0" / file
        path.unlink()
        path.mkdir()
        (path / "x.jsonl").write_text("{}\n")
    return mutate


def _truncate(file: str) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        path = run / "rank-0" / file
        data = path.read_bytes()
        cut = len(data) // 2
        while data[cut - 1:cut + 1].count(b"\n"):  # inside a line
            cut += 1
        path.write_bytes(data[:cut])
    return mutate


def _garbage(file: str) -> Callable[[Path], None]:
    return _write(file, random.Random(file).randbytes(64 * 1024))


def _edit_manifest(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        path = run / "rank-0" / schema.MANIFEST
        data = json.loads(path.read_text())
        replaced = change(data)
        path.write_text(json.dumps(data if replaced is None else replaced))
    return mutate


def _set(keys: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        for key in keys[:-1]:
            data = data.setdefault(key, {})
        data[keys[-1]] = value
    return change


def _first(kind: str) -> Callable[[Path], dict[str, Any]]:
    """The first record of ``kind`` in the base steps.jsonl (a step, annotation, scalar, phase, device)."""
    def get(run: Path) -> dict[str, Any]:
        for line in _lines(run / "rank-0" / schema.STEPS):
            record = json.loads(line)
            if record.get("k") == kind:
                return dict(record)
        raise AssertionError(f"the base recording has no {kind!r} record")
    return get


WRONG = [None, True, "x", "", [], {}, [1, [2]], {"a": {"b": 1}}, -1, 0, 1.5, 2**64, "1e400"]
"""Values of the wrong type (or range) for any field."""


def _wrong_types(file: str) -> Callable[[Path], None]:
    """Every record of the file again with each field, in turn, set to each wrong value."""
    def mutate(run: Path) -> None:
        path = run / "rank-0" / file
        records = [json.loads(line) for line in _lines(path)]
        if file == schema.STEPS:  # one record of each kind is enough
            records = list({r.get("k"): r for r in records}.values())
        out = []
        for record in records[:4]:
            for key in record:
                for value in WRONG:
                    out.append(json.dumps({**record, key: value}))
        with open(path, "a") as handle:
            handle.write("\n".join(out) + "\n")
    return mutate


def _step_with(**fields: Any) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        record = {**_first("s")(run), **fields}
        _append(schema.STEPS, json.dumps(record))(run)
    return mutate


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _huge_numbers(run: Path) -> None:
    step = _first("s")(run)
    lines = [json.dumps(step).replace(str(step["t"]), big) for big in ("1e400", "-1e400", str(10**30), "1" * 5000)]
    lines += [json.dumps(step).replace(str(step["d"]), big) for big in ("1e400", str(2**63), "-5")]
    lines.append(json.dumps({**step, "x": {"loss": 1}}).replace('"loss": 1', '"loss": 1e400'))
    _append(schema.STEPS, *lines)(run)


def _samples_huge_numbers(run: Path) -> None:
    sample = sample_records(run / "rank-0" / schema.SAMPLES)[0]
    text = json.dumps(sample)
    _append(schema.SAMPLES, text.replace(str(sample["t"]), "1e400"), text.replace(str(sample["t"]), str(10**30)),
            text.replace('"rss": ', '"rss": 1e400, "x": '))(run)


def _nan(run: Path) -> None:
    step = _first("s")(run)
    _append(schema.STEPS, json.dumps({**step, "d": math_nan()}), json.dumps({**step, "x": {"loss": math_nan()}}),
            json.dumps({**step, "t": float("inf")}))(run)


def math_nan() -> float:
    return float("nan")


def _samples_nan(run: Path) -> None:
    sample = sample_records(run / "rank-0" / schema.SAMPLES)[0]
    _append(schema.SAMPLES, json.dumps({**sample, "pcpu": math_nan(), "cpu": [math_nan(), float("inf")],
                                        "mem": float("-inf")}),
            json.dumps({**sample, "t": math_nan()}))(run)


def _samples_bad_blocks(run: Path) -> None:
    """Block lines (schema 1.3, as the writer writes them) that are not what the writer writes: each skipped
    whole."""
    path = run / "rank-0" / schema.SAMPLES
    block = json.loads(next(line for line in _lines(path) if line.startswith('{"k":"b"')))
    n, width = len(decode(block)), len(block["c"]) + sum(map(len, block.get("gpu", {}).values()))
    inf = base64.b64encode(struct.pack(f"<{n * width}d", *[0.5] * (n * width - 1), float("inf"))).decode()
    bad = [{**block, "t": block["t"][:-4] + "!!!!"}, {**block, "t": block["t"][:-2]}, {**block, "t": [1, 2]},
           {**block, "t": base64.b64encode(struct.pack(f"<{n}q", *[-1] * n)).decode()}, {**block, "t": ""},
           {**block, "v": block["v"][:-8]}, {**block, "v": inf}, {**block, "v": "é" * 12}, {**block, "c": ["x"]},
           {**block, "c": block["c"] + block["c"][:1]}, {**block, "gpu": {str(g): [] for g in range(65)}},
           {**block, "ncpu": n + 1}, {**block, "busy": "A" * (4 * limits.MAX_CORES + 4)}, {**block, "v": 7},
           {**block, "t": "A" * 600_000}]
    _append(schema.SAMPLES, *(json.dumps(b) for b in bad))(run)


def _samples_bad_old_blocks(run: Path) -> None:
    """Block lines of schema 1.2 (a column of numbers per key) that are not what its writer wrote."""
    samples = sample_records(run / "rank-0" / schema.SAMPLES)[:4]
    for i, sample in enumerate(samples):
        sample.update({"cpu": [0.25 * i, 0.5], "iow": [0.0, 0.01], "mem": 0.5, "disk": [i, i], "net": [i, i]})
    block = encode([{k: v for k, v in s.items() if k not in ("cpum", "cpux", "iowm", "iowx", "ncpu", "busy",
                                                             "niow", "iowait")} for s in samples])
    n = len(block["t"])
    bad = [{**block, "pcpu": block["pcpu"][:-1]}, {**block, "t": [str(t) for t in block["t"]]},
           {**block, "t": []}, {**block, "rss": [float("inf")] * n}, {**block, "cpu": [[True, "x"]] * n},
           {**block, "cpu": [[0.5] * (limits.MAX_CORES + 1)] * n}, {**block, "disk": [[1, 2, 3]] * n},
           {**block, "gpu": {str(g): {"u": [0.5] * n} for g in range(limits.MAX_GPUS + 1)}},
           {**block, "gpu": {"0": {"u": [float("-inf")] * n}}}, {**block, "gpu": {"0": {"u": "x"}}},
           {**block, "t": [10**30] * n}, {**block, "mem": {"a": 1}}]
    _append(schema.SAMPLES, *(json.dumps(b) for b in [block, *bad]))(run)  # the first one read


def _many_names(run: Path) -> None:
    step = _first("s")(run)
    lines = (json.dumps({**step, "a": [[f"region-{i}", 0, 1, 0]]}) for i in range(limits.MAX_NAMES + 5))
    _append(schema.STEPS, *lines)(run)


def _huge_attributes(file: str) -> Callable[[Path], None]:
    def mutate(run: Path) -> None:
        path = run / "rank-0" / file
        if file == schema.STEPS:
            step = _first("s")(run)
            _append(file, json.dumps({**step, "a": [["r", 0, 1, 0]] * (limits.MAX_STEP_REGIONS + 1)}),
                    json.dumps({**step, "x": {f"s{i}": 1.0 for i in range(limits.MAX_STEP_SCALARS + 1)}}),
                    json.dumps({**step, "ph": "p" * (limits.MAX_STRING_CHARS + 1)}))(run)
        elif file == schema.SAMPLES:  # sample lines (schema 1.1) past the limits
            sample = sample_records(path)[0]
            _append(file, json.dumps({**sample, "cpu": [0.5] * (limits.MAX_CORES + 1)}),
                    json.dumps({**sample, "gpu": {str(i): {"u": 0.5} for i in range(limits.MAX_GPUS + 1)}}),
                    json.dumps({**sample, "gpu": {"0": {f"k{i}": 1 for i in range(limits.MAX_GPU_KEYS + 1)}}}),
                    *(json.dumps({**sample, "gpu": {f"g{i}": {"u": 0.1}}}) for i in range(limits.MAX_GPUS + 3)))(run)
        elif file == schema.PROFILES:
            window = json.loads(_lines(path)[0])
            op = window["cpu_ops"][0]
            _append(file, json.dumps({**window, "cpu_ops": [op] * (limits.MAX_PROFILE_ENTRIES + 1)}),
                    json.dumps({**window, "gpu_activity_s": {f"a{i}": 1.0 for i in range(20_000)}}))(run)
        elif file == schema.MANIFEST:
            _edit_manifest(_set(("resource",), {f"attr.{i}": "v" * 10 for i in range(20_000)}))(run)
        else:  # spans, metrics: an OTLP message whose attribute lists are long (within the line limit)
            message = json.loads(_lines(path)[0])
            attributes = [{"key": f"k{i}", "value": {"stringValue": "v"}} for i in range(20_000)]
            message[next(iter(message))][0]["resource"]["attributes"] = attributes
            _append(file, json.dumps(message))(run)
    return mutate


def _huge_line(file: str) -> Callable[[Path], None]:
    """One line past the file's limit (64 MiB for steps.jsonl, the size that used to take 8.7 GiB)."""
    def mutate(run: Path) -> None:
        size = 64 * 2**20 if file == schema.STEPS else limits.MAX_LINE_BYTES[file] + 1
        with open(run / "rank-0" / file, "ab") as out:
            if file == schema.STEPS:
                step = _first("s")(run)
                head = json.dumps({**step, "ph": ""}).encode().split(b'"ph": ""')
                out.write(head[0] + b'"ph": "' + b"x" * size + b'"' + head[1] + b"\n")
            else:
                out.write(b'{"t": "' + b"x" * size + b'"}\n')
    return mutate


def _regex_bomb(run: Path) -> None:
    """A step line built to make a backtracking matcher take quadratic time (within the line limit)."""
    prefix = '{"k":"s","ph":"a","n":1,"t":1,"d":1,"a":['
    _append(schema.STEPS, prefix + '],"x":{' * ((limits.MAX_LINE_BYTES[schema.STEPS] - len(prefix)) // 7))(run)


def _symlink_loop(run: Path) -> None:
    path = run / "rank-0" / schema.STEPS
    path.unlink()
    path.symlink_to(path.name)


def _device_file(run: Path) -> None:
    path = run / "rank-0" / schema.STEPS
    path.unlink()
    path.symlink_to("/dev/zero")


def _fifo(run: Path) -> None:
    path = run / "rank-0" / schema.STEPS
    path.unlink()
    os.mkfifo(path)


def _duplicated_rank(run: Path) -> None:
    shutil.copytree(run / "rank-0", run / "rank-7")


def _rank_symlink_loop(run: Path) -> None:
    (run / "rank-9").symlink_to("rank-9")


def _zero_steps(run: Path) -> None:
    """A job killed during initialization: the manifest of a running process, no step records."""
    rank0 = run / "rank-0"
    lines = [line for line in _lines(rank0 / schema.STEPS) if json.loads(line)["k"] in ("a", "x")]
    (rank0 / schema.STEPS).write_text("\n".join(lines) + "\n")

    def killed(manifest: dict[str, Any]) -> None:
        manifest["lifecycle"] = {k: manifest["lifecycle"][k] for k in ("process_start", "init")}
        manifest["status"] = schema.STATUS_RUNNING

    _edit_manifest(killed)(run)
    shutil.rmtree(run / "rank-1")


def _surrogates(run: Path) -> None:
    step = _first("s")(run)
    text = json.dumps({**step, "ph": "PHASE"})
    _append(schema.STEPS, text.replace("PHASE", "\\ud800"), text.replace("PHASE", "\\udc00x"),
            text.replace("PHASE", "ok \\ud83d\\ude00"))(run)


def _build() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    data_files = (schema.STEPS, schema.SPANS, schema.METRICS, schema.SAMPLES, schema.PROFILES)
    for file in (schema.MANIFEST, *data_files):
        manifest = file == schema.MANIFEST
        cases[f"{file}:missing"] = Case(_remove(file), ERROR if manifest else ANY)
        cases[f"{file}:empty"] = Case(_write(file, b""), ERROR if manifest else ANY)
        cases[f"{file}:directory"] = Case(_directory(file), ERROR)
        cases[f"{file}:garbage"] = Case(_garbage(file), ERROR if manifest else SKIPS)
        cases[f"{file}:truncated"] = Case(_truncate(file), ERROR if manifest else SKIPS)
        cases[f"{file}:huge-attributes"] = Case(_huge_attributes(file),
                                                SKIPS if file in (schema.STEPS, schema.SAMPLES, schema.PROFILES)
                                                else ANY)
    for file in data_files:
        cases[f"{file}:nested"] = Case(_append(file, _nested(100_000), '{"t": ' + _nested(900) + "}"), SKIPS)
        cases[f"{file}:wrong-types"] = Case(_wrong_types(file), SKIPS)
        cases[f"{file}:huge-line"] = Case(_huge_line(file), SKIPS)
    cases["manifest.json:list"] = Case(_write(schema.MANIFEST, b"[]"), ERROR)
    cases["manifest.json:nested"] = Case(_write(schema.MANIFEST, _nested(100_000).encode()), ERROR)
    cases["manifest.json:too-large"] = Case(_edit_manifest(_set(("pad",), " " * limits.MAX_MANIFEST_BYTES)), ERROR)
    cases["manifest.json:schema-2"] = Case(_edit_manifest(_set(("schema_version",), "2.0")), ERROR)
    cases["manifest.json:surrogate"] = Case(_write(schema.MANIFEST, b'{"schema_version": "1.1", "run_id": '
                                                                    b'"\\ud800"}'), ERROR)
    cases["manifest.json:rank-abc"] = Case(_edit_manifest(_set(("rank",), "abc")), ERROR)
    cases["manifest.json:lifecycle-list"] = Case(_edit_manifest(_set(("lifecycle",), [1, 2])), ERROR)
    cases["manifest.json:lifecycle-1e400"] = Case(_write(schema.MANIFEST, b'{"schema_version": "1.1", "lifecycle": '
                                                                          b'{"init": 1e400}}'), ERROR)
    for key, value in (("rank", -1), ("rank", 2**40), ("world_size", 1.5), ("local_rank", None), ("run_id", 7),
                       ("status", []), ("resource", "x"), ("config", [1]), ("dropped", 3), ("schema_version", 1)):
        cases[f"manifest.json:{key}={json.dumps(value)}"] = Case(_edit_manifest(_set((key,), value)),
                                                                 ANY if value is None else ERROR)
    for event in schema.LIFECYCLE_EVENTS:
        for value in ("x", -5, float("inf"), [1]):
            cases[f"manifest.json:lifecycle.{event}={json.dumps(value)}"] = Case(
                _edit_manifest(_set(("lifecycle", event), value)), ERROR)
    for key, value in (("outlier_sigma", "x"), ("outlier_sigma", 1e300), ("outlier_min_steps", -1),
                       ("job_name", {"a": 1})):
        cases[f"manifest.json:config.{key}={json.dumps(value)}"] = Case(
            _edit_manifest(_set(("config", key), value)), ERROR)
    cases["steps.jsonl:huge-numbers"] = Case(_huge_numbers, SKIPS)
    cases["steps.jsonl:nan"] = Case(_nan, SKIPS)
    cases["steps.jsonl:negative-duration"] = Case(_step_with(d=-5), SKIPS)
    cases["steps.jsonl:region-depth-past-int32"] = Case(_step_with(a=[["r", 0, 1, 2**40]]), SKIPS)
    cases["steps.jsonl:error-not-a-string"] = Case(_step_with(err={"type": "x"}), SKIPS)
    cases["steps.jsonl:surrogates"] = Case(_surrogates, SKIPS)
    cases["steps.jsonl:regex-bomb"] = Case(_regex_bomb, SKIPS)
    cases["steps.jsonl:many-names"] = Case(_many_names, SKIPS)
    cases["steps.jsonl:control-characters"] = Case(_step_with(ph="\x1b[2J\r\n\x00"), ANY)
    cases["steps.jsonl:symlink-loop"] = Case(_symlink_loop, ERROR)
    cases["steps.jsonl:device"] = Case(_device_file, ERROR)
    cases["steps.jsonl:fifo"] = Case(_fifo, ERROR)
    cases["steps.jsonl:zero-steps"] = Case(_zero_steps, ANY)
    cases["samples.jsonl:huge-numbers"] = Case(_samples_huge_numbers, SKIPS)
    cases["samples.jsonl:nan"] = Case(_samples_nan, SKIPS)
    cases["samples.jsonl:bad-blocks"] = Case(_samples_bad_blocks, SKIPS)
    cases["samples.jsonl:bad-blocks-1.2"] = Case(_samples_bad_old_blocks, SKIPS)
    cases["ranks:duplicated"] = Case(_duplicated_rank, ERROR)
    cases["ranks:symlink-loop"] = Case(_rank_symlink_loop, ANY)
    return cases


CASES = _build()
