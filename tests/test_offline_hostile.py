"""The offline tools on every malformed recording of the corpus (tests/malformed_recordings.py): a one-line
error and exit 2, or output that says how many lines were skipped; never a traceback, never the CLI's
last-resort guard, never ``check``'s exit 1 for anything but a check that fired, and outputs that stay
small however large the input."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otelprof import cli
from otelprof.analysis.report import build_report, load
from otelprof.recording import limits, schema
from otelprof.recording.errors import RecordingError
from otelprof.recording.reader import read_recording
from tests.malformed_recordings import ANY, CASES, ERROR, ROOT, RUN_ID, SKIPS, record_base

SKIP_NOTE = "truncated, corrupt or oversized line"
MAX_OUTPUT = 2 * 2**20
"""Largest report or trace a case may produce (the base recording's are 15 to 80 KiB)."""


@pytest.fixture(scope="session")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_base(tmp_path_factory.mktemp("corpus"))


def _commands(base: Path, run: Path, out: Path) -> dict[str, list[str]]:
    return {
        "report": ["report", "-q", "-o", str(out / "report.html"), str(run)],
        "report --format json": ["report", "-q", "--format", "json", "-o", str(out / "report.json"), str(run)],
        "timeline": ["timeline", "-q", "-o", str(out / "trace.json"), str(run)],
        "check": ["check", str(run)],
        "check --json": ["check", "--json", str(run)],
        "compare": ["compare", str(base), str(run)],
    }


def _reads_whole(command: str, file: str) -> bool:
    """Whether ``command`` reads every line of ``file`` (so that it must report the lines it skipped)."""
    if file in (schema.STEPS, schema.SAMPLES):
        return True
    return file == schema.PROFILES and command in ("report", "report --format json", "timeline")


def _judge(command: str, rc: int, out: str, err: str) -> None:
    name = command.split()[0]
    assert "Traceback" not in out + err
    assert "internal error" not in err, f"the CLI's last-resort guard was needed: {err}"
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith(f"otelprof {name}: "), err
    elif name == "check" and rc == 1:
        assert "FIRED" in out or '"fired": true' in out, "exit 1 without a check that fired"
    else:
        assert rc == 0, (rc, err)


@pytest.mark.parametrize("case", sorted(CASES))
def test_offline_tools_on_a_malformed_recording(case: str, base_run: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / RUN_ID
    shutil.copytree(base_run, run, symlinks=True)
    CASES[case].mutate(run)
    expect = CASES[case].expect
    file = case.split(":")[0]
    for command, argv in _commands(base_run, run, tmp_path).items():
        rc = cli.main(argv)
        out, err = capsys.readouterr()
        _judge(command, rc, out, err)
        if expect == ERROR:
            assert rc == 2, (command, out)
        elif expect == SKIPS:
            assert rc in (0, 1), (command, err)
            if _reads_whole(command, file):
                assert SKIP_NOTE in out + err, (command, out, err)
    for output in tmp_path.glob("*.*"):
        assert output.stat().st_size <= MAX_OUTPUT, output


def test_the_corpus_covers_every_file_and_outcome() -> None:
    for file in (schema.MANIFEST, schema.STEPS, schema.SPANS, schema.METRICS, schema.SAMPLES, schema.PROFILES):
        for mutation in ("missing", "empty", "directory", "garbage", "truncated", "huge-attributes"):
            assert f"{file}:{mutation}" in CASES
    assert {c.expect for c in CASES.values()} == {ERROR, SKIPS, ANY}


def test_base_recording_reads_clean_with_every_record_kind(base_run: Path) -> None:
    recording = read_recording(base_run, samples=True)
    assert recording.skipped_lines == 0 and [r.rank for r in recording.ranks] == [0, 1]
    rank = recording.ranks[0]
    assert len(rank.steps) == 45 and rank.annotations and rank.scalars and rank.phases and rank.device_times
    assert rank.sample_columns().node_samples and len(recording.ranks[1].sample_columns())
    assert list(rank.profiles()) and list(rank.spans()) and rank.last_metric_snapshot() is not None
    assert recording.skipped_lines == 0


def test_zero_steps_report_has_a_rules_section_with_no_data(base_run: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A job killed during initialization: the report renders what there is, the checks say "no data"."""
    run = tmp_path / RUN_ID
    shutil.copytree(base_run, run)
    CASES["steps.jsonl:zero-steps"].mutate(run)
    report = build_report(load(run))
    assert report.rules.error is None and report.rules.rows
    step_checks = [r for r in report.rules.rows if r.alert in ("OtelprofStepOutliers", "OtelprofTrainingStalled",
                                                                 "OtelprofLossNotDecreasing")]
    assert len(step_checks) == 3 and {r.status for r in step_checks} == {"no data"}
    assert cli.main(["report", "-q", "-o", str(tmp_path / "r.json"), str(run)]) == 0
    out, err = capsys.readouterr()
    assert "could not run" not in out + err and err == ""
    rules = json.loads((tmp_path / "r.json").read_text())["rules"]
    assert rules["error"] is None and len(rules["rows"]) == len(report.rules.rows)
    assert cli.main(["check", "--json", str(run)]) == 0
    verdicts = {r["alert"]: r["status"] for r in json.loads(capsys.readouterr().out)["checks"]}
    assert verdicts["OtelprofStepOutliers"] == "no data"


def test_guard_turns_an_unexpected_exception_into_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from otelprof.cli import report as commands

    def boom(args: object) -> int:
        raise RuntimeError("deep inside\nsecond line \x1b[2J")

    monkeypatch.setattr(commands, "cmd_timeline", boom)
    assert cli.main(["timeline", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "\x1b" not in err
    assert err.startswith("otelprof timeline: internal error: RuntimeError: deep inside\\nsecond line")
    assert "--debug" in err
    assert cli.main(["--debug", "timeline", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise RuntimeError("deep inside' in err


def test_check_exits_2_not_1_when_the_checks_crash(base_run: Path) -> None:
    """Through the real command line: a failure inside the checks is bad input / an error, never a verdict."""
    script = ("import sys; import otelprof.analysis.checks as checks\n"
              "def boom(*a, **k): raise ZeroDivisionError('inside a check')\n"
              "checks.evaluate = boom\n"
              "from otelprof.cli import main; sys.exit(main(['check', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", script, str(base_run)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "otelprof check: the checks could not run: ZeroDivisionError: inside a check\n"


def test_huge_line_in_a_real_process_stays_bounded(base_run: Path, tmp_path: Path) -> None:
    """The issue's case end to end: a 64 MiB steps.jsonl line used to cost 31 s, 8.7 GiB and a 448 MiB
    report. Each command runs as a real process under a 1.5 GiB address-space limit (the line alone is
    64 MiB; read whole and decoded it needs several times that) and writes small files."""
    run = tmp_path / RUN_ID
    shutil.copytree(base_run, run)
    CASES["steps.jsonl:huge-line"].mutate(run)
    assert (run / "rank-0" / schema.STEPS).stat().st_size > 64 * 2**20

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))

    for command, argv in _commands(base_run, run, tmp_path).items():
        done = subprocess.run([sys.executable, "-m", "otelprof", *argv], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, preexec_fn=limit)
        _judge(command, done.returncode, done.stdout, done.stderr)
        assert done.returncode == 0, (command, done.stderr)
        assert SKIP_NOTE in done.stdout + done.stderr
    for output in ("report.html", "report.json", "trace.json"):
        assert (tmp_path / output).stat().st_size <= MAX_OUTPUT


def test_reader_raises_only_its_own_error_in_parallel_too(base_run: Path, tmp_path: Path) -> None:
    run = tmp_path / RUN_ID
    shutil.copytree(base_run, run)
    CASES["manifest.json:rank-abc"].mutate(run)
    with pytest.raises(RecordingError, match="rank is not an integer"):
        read_recording(run, samples=True, workers=2)
    run2 = tmp_path / "second" / RUN_ID
    shutil.copytree(base_run, run2)
    CASES["steps.jsonl:garbage"].mutate(run2)
    assert read_recording(run2, samples=True, workers=2).skipped_lines > 0


def test_line_exactly_at_the_limit_is_read_and_one_byte_more_is_skipped(base_run: Path, tmp_path: Path) -> None:
    run = tmp_path / RUN_ID
    shutil.copytree(base_run, run)
    steps = run / "rank-0" / schema.STEPS
    step = json.loads(next(line for line in steps.read_text().splitlines() if line.startswith('{"k":"s"')))
    text = json.dumps({**step, "n": 10_000, "a": [["r" * 200, 0, 1, 0]] * 4000})
    limit = limits.MAX_LINE_BYTES[schema.STEPS]
    steps.write_text(text + " " * (limit - len(text)) + "\n" + text + " " * (limit + 1 - len(text)) + "\n")
    rank = read_recording(run).ranks[0]
    assert [s.number for s in rank.steps] == [10_000] and len(rank.steps[0].annotations) == 4000
    assert rank.skipped_lines == 1


def test_reader_limits_hold_what_the_recorder_writes() -> None:
    from otelprof.runtime import hotpath

    assert limits.MAX_STEP_REGIONS == hotpath.MAX_STEP_ANNOTATIONS  # a step the recorder writes is never cut
    assert all(limits.MAX_LINE_BYTES[f] >= 2**20 for f in (schema.STEPS, schema.SAMPLES, schema.PROFILES))
