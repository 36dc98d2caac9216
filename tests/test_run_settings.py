"""``otelprof run`` never refuses to start the program over a setting (issue "never harm", §2): the program's
own ``init()`` warns once and keeps the default, and the program's exit status is passed through. The other
subcommands keep their strict one-line error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = "from pathlib import Path; Path('ran').write_text('yes'); raise SystemExit(3)"


def _env(tmp_path: Path, name: str, value: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            "OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_SYSTEM_METRICS": "false", name: value}


def _otelprof_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("otelprof")]


@pytest.mark.parametrize(("name", "value"), [
    ("OTELPROF_PROFILE_EVERY", "abc"),
    ("OTELPROF_COLLECTIONS", "loss=("),
    ("OTELPROF_COLLECTIONS", "(bad"),
    ("OTELPROF_RUN_ID", "a/b"),
    ("OTELPROF_FLUSH_INTERVAL", "fast"),
    ("OTELPROF_RECORD", "maybe"),
])
def test_run_starts_the_program_despite_a_rejected_setting(tmp_path: Path, name: str, value: str) -> None:
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "-q", "--", sys.executable, "-c", PROGRAM],
                            env=_env(tmp_path, name, value), cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert (tmp_path / "ran").read_text() == "yes", result.stderr
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert "invalid configuration" not in result.stderr  # not the strict CLI error
    warnings = [line for line in _otelprof_lines(result.stderr) if "invalid" in line]
    assert len(warnings) == 1, result.stderr
    assert (name in warnings[0]) if name != "OTELPROF_RUN_ID" else ("run id" in warnings[0])
    assert "default" in warnings[0] or "new one" in warnings[0]


def test_run_warning_is_escaped(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "-q", "--", sys.executable, "-c", PROGRAM],
                            env=_env(tmp_path, "OTELPROF_RUN_ID", "a/\x1b[31mred"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    assert "\x1b" not in result.stderr
    assert len(_otelprof_lines(result.stderr)) == 1, result.stderr


@pytest.mark.parametrize(("name", "value"), [("OTELPROF_PROFILE_EVERY", "abc"), ("OTELPROF_COLLECTIONS", "loss=(")])
def test_strict_subcommands_still_refuse_a_rejected_setting(tmp_path: Path, name: str, value: str) -> None:
    result = subprocess.run([sys.executable, "-m", "otelprof", "env"], env=_env(tmp_path, name, value), cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("otelprof: invalid configuration:") and name in lines[0], lines


@pytest.mark.parametrize(("call", "said"), [("otelprof.init()", []), ("otelprof.init(job_name='mine')", ["job_name"])])
def test_a_scripts_own_init_under_run_is_quiet_unless_its_arguments_are_dropped(tmp_path: Path, call: str,
                                                                              said: list[str]) -> None:
    """A script that calls ``otelprof.init()`` runs under ``otelprof run`` as it is (the documented Job does):
    nothing on its stderr; arguments that the running session cannot take are named, once."""
    program = f"import otelprof\n{call}\nwith otelprof.step():\n    pass\notelprof.shutdown()\n"
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "-q", "--", sys.executable, "-c", program],
                            env=_env(tmp_path, "OTELPROF_RECORD", "false"), cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = _otelprof_lines(result.stderr)
    assert len(lines) == len(said), result.stderr
    for name, line in zip(said, lines):
        assert "keeping it" in line and name in line
