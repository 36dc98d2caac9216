"""Runs one document's code blocks in order, in the current directory (tests/test_doc_blocks.py starts it).

``python tests/doc_blocks_driver.py STEPS.json RESULTS.jsonl`` reads a list of steps and writes one JSON line
per step run, ``{"where": ..., "ok": bool, "detail": ...}``, stopping at the first that fails. Python blocks
run in this process, in one namespace (a block sees what the blocks before it defined); shell lines each in
``bash -c``; ``file`` steps write a block under the name the document gives it; ``yaml`` and ``json`` blocks
are parsed, and whole Prometheus and Alertmanager files are checked with promtool / amtool. The docs'
placeholders (``<run-id>``, ``RUN_ID``) name the newest recorded run with steps in ``./otelprof-runs``.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

RUNS = Path("otelprof-runs")
PLACEHOLDERS = {"<release>": "monitoring"}


def newest_run() -> Path:
    """The newest run of ./otelprof-runs whose rank 0 recorded a step."""
    runs = [d for d in RUNS.iterdir() if (d / "rank-0" / "steps.jsonl").is_file()
            and (d / "rank-0" / "steps.jsonl").stat().st_size > 0] if RUNS.is_dir() else []
    if not runs:
        raise RuntimeError("no recorded run with steps in ./otelprof-runs")
    return max(runs, key=lambda d: (d.name[:15], (d / "rank-0" / "steps.jsonl").stat().st_mtime))


def substitute(code: str) -> str:
    if "<run-id>" in code or "RUN_ID" in code:
        run_id = newest_run().name
        code = code.replace("<run-id>", run_id).replace("RUN_ID", run_id)
    for placeholder, value in PLACEHOLDERS.items():
        code = code.replace(placeholder, value)
    return code


def _before_after(line: str) -> None:
    """`otelprof compare before/ after/`: the two newest runs (or the one run twice), as the reader's own."""
    if "before/" not in line or Path("before").exists():
        return
    runs = sorted((d for d in RUNS.iterdir() if (d / "rank-0").is_dir()), key=lambda d: d.name)
    shutil.copytree(runs[-2] if len(runs) > 1 else runs[-1], "before")
    shutil.copytree(runs[-1], "after")


def run_python(code: str, namespace: dict[str, Any]) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(substitute(code), "<doc block>", "exec"), namespace)
        return True, out.getvalue()[-2000:]
    except BaseException:  # the block's failure is the result, whatever it raised
        return False, out.getvalue()[-2000:] + traceback.format_exc()[-4000:]
    finally:
        _close_sessions()


def _close_sessions() -> None:
    """What a block started ends with it, as at the end of a script."""
    otelprof = sys.modules.get("otelprof")
    if otelprof is not None:
        otelprof.shutdown()
    integration = sys.modules.get("otelprof.integrations.torch")
    if integration is not None:
        integration.uninstrument()


def run_shell(line: str, expect: list[int]) -> tuple[bool, str]:
    _before_after(line)
    command = substitute(line)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600)
    detail = f"$ {command}\nexit {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-3000:]}"
    ok = done.returncode in expect and "Traceback" not in done.stderr
    if ok and "--json" in command.split():
        try:
            json.loads(done.stdout)
        except ValueError:
            return False, "stdout is not JSON\n" + detail
    return ok, detail


def check_yaml(text: str) -> tuple[bool, str]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return False, str(error)
    tool: list[str] | None = None
    if isinstance(data, dict) and "groups" in data:
        tool = ["promtool", "check", "rules"]
    elif isinstance(data, dict) and "scrape_configs" in data:
        tool = ["promtool", "check", "config"]
    elif isinstance(data, dict) and "route" in data and "receivers" in data:
        tool = ["amtool", "check-config"]
    if tool is None:
        return True, "parsed"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "block.yaml"
        path.write_text(text, encoding="utf-8")
        done = subprocess.run([*tool, str(path)], capture_output=True, text=True, timeout=120)
    return done.returncode == 0, " ".join(tool) + "\n" + done.stdout + done.stderr


def main(steps_file: str, results_file: str) -> None:
    steps = json.loads(Path(steps_file).read_text(encoding="utf-8"))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    results = open(results_file, "a", encoding="utf-8")  # noqa: SIM115  closed at exit, written line by line
    for step in steps:
        kind, code = step["kind"], step["code"]
        if kind == "python":
            ok, detail = run_python(code, namespace)
        elif kind == "shell":
            ok, detail = run_shell(code, step["expect"])
        elif kind == "file":
            Path(step["name"]).write_text(code, encoding="utf-8")
            ok, detail = True, f"wrote {step['name']}"
        elif kind == "yaml":
            ok, detail = check_yaml(code)
        elif kind == "json":
            try:
                json.loads(code)
                ok, detail = True, "parsed"
            except ValueError as error:
                ok, detail = False, str(error)
        else:
            ok, detail = False, f"unknown step kind {kind}"
        results.write(json.dumps({"where": step["where"], "ok": ok, "detail": detail}) + "\n")
        results.flush()
        if not ok:
            break  # later blocks build on this one


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
