"""``otelprof report``, ``timeline``, ``check`` and ``compare``: thin command handlers over the analysis.

Exit codes: 0 done (``check``: no check fired), 1 ``check`` found a firing check, 2 bad input (not a
recording, a manifest or recording file that is not what otelprof writes, unknown schema major version,
missing directory, unreachable Prometheus, bad options) or an internal error, with one line on stderr.
Lines of a recording that cannot be used (truncated, corrupt, past the reader's limits) are skipped,
counted and reported, not fatal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from otelprof._log import escape as one_line
from otelprof.recording.errors import RecordingError
from otelprof.recording.ranks import Recording
from otelprof.recording.reader import latest_run
from otelprof.report.progressbar import progress_bar

EXIT_USAGE = 2
CONFIG_HELP = ("YAML or JSON file of mixin settings (MixinConfig field: value; the file of otelprof mixin "
               "--config), applied before --set; docs/mixin-settings.md lists them")
PROGRESS_HELP = "a progress bar of the ranks read on stderr even when it is not a terminal (it is on a terminal)"


def _err(command: str, message: str) -> int:
    print(f"otelprof {command}: {one_line(message, 1000)}", file=sys.stderr)
    return EXIT_USAGE


def _skipped(recording: Recording) -> str:
    """What the reader skipped, for a note ("" when nothing)."""
    n = recording.skipped_lines
    return f"{n:,} truncated, corrupt or oversized line{'s' if n != 1 else ''} skipped" if n else ""


def _progress(quiet: bool) -> Any:
    if quiet:
        return None
    started = time.monotonic()

    def say(message: str) -> None:
        # Messages quote the recording (phase names, node names): escaped, never raw on the terminal.
        print(f"[{time.monotonic() - started:6.1f} s] {one_line(message, 1000)}", file=sys.stderr, flush=True)

    return say


def resolve_run(path: str) -> Path:
    """A run directory; a directory of runs (``./otelprof-runs``) means its newest run. A URL (``s3://...``) is
    downloaded first (:func:`otelprof.recording.remote.local_copy`)."""
    from otelprof.recording import remote

    if remote.is_url(path):
        try:
            return remote.local_copy(path)
        except remote.RemoteError as exc:
            raise RecordingError(str(exc)) from None
    root = Path(path)
    if not root.exists():
        raise RecordingError(f"{root} does not exist")
    if not root.is_dir():
        raise RecordingError(f"{root} is not a directory")
    if (root / "manifest.json").exists() or any(root.glob("rank-*")):
        return root
    newest = latest_run(root)
    if newest is None:
        raise RecordingError(f"{root} is not an otelprof recording (no manifest.json, no rank-*/ directories, "
                             "no runs inside)")
    return newest


def _config(args: argparse.Namespace) -> Any:
    """The checks' thresholds: ``--config FILE`` (as for ``otelprof mixin``), then each ``--set``."""
    from otelprof.mixin.config import from_settings

    return from_settings(args.config, args.set)


def cmd_report(args: argparse.Namespace) -> int:
    from otelprof.analysis.report import build_report, load, report_dict
    from otelprof.report.html import render

    say = _progress(args.quiet)
    try:
        config = _config(args)
    except ValueError as exc:
        return _err("report", str(exc))
    if args.prometheus:
        from otelprof.analysis.prometheus import PrometheusError, parse_time, report_from_prometheus

        if not args.job:
            return _err("report", "--prometheus needs --job NAME (the job_name label of the training job)")
        if args.run_dir:
            return _err("report", "give either RUN_DIR or --prometheus, not both")
        try:
            start, end = parse_time(args.start), parse_time(args.end)
        except ValueError as exc:
            return _err("report", f"--from/--to: {exc}")
        try:
            report = report_from_prometheus(args.prometheus, args.job, start, end, config, say, args.timeout)
        except PrometheusError as exc:
            return _err("report", str(exc))
    else:
        if not args.run_dir:
            return _err("report", "give a run directory (e.g. otelprof-runs/<run-id>) or --prometheus URL --job NAME")
        bar = progress_bar("reading", args.quiet, args.progress)
        try:
            run = resolve_run(args.run_dir)
            recording = load(run, None if bar else say, bar.ranks if bar else None, checks=not args.no_checks)
        except RecordingError as exc:
            return _err("report", str(exc))
        finally:
            if bar:
                bar.close()
        report = build_report(recording, config, args.check_interval, say, checks=not args.no_checks)
    fmt = args.format or ("json" if args.output and args.output.endswith(".json") else "html")
    output = Path(args.output or f"report.{fmt}")
    text = json.dumps(report_dict(report), indent=1, allow_nan=False) if fmt == "json" else render(report)
    try:
        output.write_text(text, encoding="utf-8", errors="replace")
    except OSError as exc:
        return _err("report", f"cannot write {output}: {exc}")
    fired = [r.alert for r in report.rules.rows if r.triggered]
    print(f"wrote {output} ({len(text.encode()) / 1024:.0f} KiB)")
    if report.diagnosis.headline:
        print(f"diagnosis: {one_line(report.diagnosis.headline, 1000)}")
    if fired:
        print(f"checks that fired: {', '.join(fired)}")
    if report.rules.error:
        print(f"note: the offline checks could not run: {one_line(report.rules.error)}")
    for missing in report.summary.missing:
        print(f"note: {one_line(missing, 1000)}")
    if report.summary.skipped_lines:
        n = report.summary.skipped_lines
        print(f"note: {n:,} truncated, corrupt or oversized line{'s' if n != 1 else ''} of the recording "
              "skipped")
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from otelprof.recording.reader import read_recording
    from otelprof.report.timeline import build_timeline, write_timeline

    if args.max_steps is not None and args.max_steps < 1:
        return _err("timeline", "--max-steps must be at least 1")
    if args.from_step is not None and args.to_step is not None and args.to_step < args.from_step:
        return _err("timeline", "--to-step is before --from-step")
    from otelprof.recording.selection import parse_ranks, parse_steps

    try:
        only = parse_ranks(args.ranks) if args.ranks is not None else None
        if args.steps is not None:
            args.from_step, args.to_step = parse_steps(args.steps)
    except ValueError as exc:
        return _err("timeline", f"--ranks/--steps: {exc}")
    say = _progress(args.quiet)
    try:
        run = resolve_run(args.run_dir)
        if say:
            say(f"reading {run}")
        recording = read_recording(run, samples=not args.no_counters, only=only)
    except RecordingError as exc:
        return _err("timeline", str(exc))
    trace = build_timeline(recording, args.from_step, args.to_step, args.max_steps, args.phase,
                           not args.no_counters)
    output = Path(args.output)
    try:
        size = write_timeline(trace, output)
    except OSError as exc:
        return _err("timeline", f"cannot write {output}: {exc}")
    other = trace["otherData"]
    print(f"wrote {output} ({size / 2**20:.1f} MiB, {len(trace['traceEvents']):,} events; "
          f"{other['steps_in_window']:,} of {other['steps_in_run']:,} steps: {one_line(str(other['window']))})")
    if recording.skipped_lines:
        print(f"note: {_skipped(recording)}")
    print("open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing")
    return 0


def print_diagnosis(diagnosis: Any) -> None:
    """The diagnosis as text, before the checks' table: headline, where the time goes, findings ranked."""
    print(f"DIAGNOSIS: {one_line(diagnosis.headline, 1000)}")
    if diagnosis.time_split:
        print(f"Where the step time goes: {one_line(diagnosis.time_split, 1000)}")
    for i, f in enumerate(diagnosis.findings):
        checks = f" [{', '.join(f.checks)}]" if f.checks else ""
        print(f"{i + 1:>2}. {one_line(f.title)}: {one_line(f.cost_text, 1000)}{checks}")
        print(f"    do: {one_line(f.action, 1000)}")
        print(f"    why: {one_line(f.evidence, 1000)}")
    if diagnosis.minor:
        print("Minor: " + one_line("; ".join(f"{f.title.lower()}: {f.cost_text}" for f in diagnosis.minor), 1000))
    print()


def cmd_check(args: argparse.Namespace) -> int:
    from otelprof.analysis.diagnosis import diagnosis_dict
    from otelprof.analysis.report import build_report, load
    from otelprof.config import rule_timeout

    try:
        config = _config(args)
        timeout = rule_timeout(args.rule_timeout)
    except ValueError as exc:  # ConfigError too
        return _err("check", str(exc))
    bar = progress_bar("reading", args.quiet, args.progress)
    try:
        recording = load(resolve_run(args.run_dir), None, bar.ranks if bar else None)
    except RecordingError as exc:
        return _err("check", str(exc))
    finally:
        if bar:
            bar.close()
    report = build_report(recording, config, args.interval)  # the diagnosis weighs the analyses beside the checks
    summary = report.rules
    if summary.error:
        return _err("check", f"the checks could not run: {summary.error}")
    timed_out: list[str] = []  # a rule past the time limit: the verdicts are printed, then its line, exit 2
    for rules_file in args.rules or ():  # check rules in Python over saved tensors (docs/tensors.md)
        from dataclasses import replace

        from otelprof.analysis.check_rules import Captured, RuleError, RuleTimeout, evaluate

        printed = Captured()  # what the rules print never reaches stdout (--json stays parseable)
        try:
            rows = evaluate(recording, rules_file, printed, timeout)
        except RuleTimeout as exc:
            rows = exc.rows
            timed_out.append(str(exc))
        except RuleError as exc:
            return _err("check", f"--rules: {exc}")
        summary = replace(summary, rows=summary.rows + tuple(rows))
        if printed.total:
            print(f"otelprof check: note: the rules of {one_line(str(rules_file), 200)} printed {printed.total:,} "
                  f"characters (not shown on stdout): {one_line(printed.text, 200)}", file=sys.stderr)
    if args.json:
        if recording.skipped_lines:
            print(f"otelprof check: note: {_skipped(recording)}", file=sys.stderr)
        print(json.dumps({"diagnosis": diagnosis_dict(report.diagnosis), "checks": [
            {"alert": r.alert, "original": r.original, "severity": r.severity, "status": r.status,
             "fired": r.triggered, "firing_evaluations": r.firing_evaluations, "evaluations": r.evaluations,
             "datapoints": r.datapoints, "first_fired": r.first_fired, "subjects": list(r.subjects)}
            for r in summary.rows]}, indent=1, allow_nan=False))
    else:
        print_diagnosis(report.diagnosis)
        width = max((len(r.alert) for r in summary.rows), default=10)
        print(f"{'CHECK':<{width}}  {'VERDICT':<7}  {'SEVERITY':<8}  {'FIRED':>9}  {'DATAPOINTS':>10}  WHERE")
        for r in summary.rows:
            verdict = "FIRED" if r.triggered else r.status
            print(f"{r.alert:<{width}}  {verdict:<7}  {r.severity:<8}  {f'{r.firing_evaluations}/{r.evaluations}':>9}"
                  f"  {r.datapoints:>10,}  {one_line(', '.join(r.subjects), 1000) or '-'}")
        empty = sum(1 for r in summary.rows if r.status == "no data")
        print(f"\n{len(summary.fired)} of {len(summary.rows)} checks fired"
              + (f", {empty} had no data to judge" if empty else "")
              + f" (evaluated every {summary.interval:g} s)."
              + (f" {_skipped(recording)}." if recording.skipped_lines else ""))
        found = len(report.diagnosis.findings)
        if found and not summary.fired:
            print(f"The {found} finding{'s' if found != 1 else ''} above {'are' if found != 1 else 'is'} what the "
                  "analyses of this run found it lost or risked, not a fired check: only a fired check makes "
                  "otelprof check exit 1.")
    if timed_out:
        sys.stdout.flush()  # the verdicts first, then the failure
        return _err("check", f"--rules: {'; '.join(timed_out)}")
    return 1 if summary.fired else 0


def cmd_compare(args: argparse.Namespace) -> int:
    from otelprof.analysis.compare import METRICS, change, compare
    from otelprof.recording.reader import read_recording

    if len(args.runs) < 2:
        return _err("compare", "give at least two runs: otelprof compare RUN_A RUN_B [...]")
    if args.price_per_hour is not None and args.price_per_hour < 0:
        return _err("compare", "--price-per-hour must not be negative")
    runs: list[tuple[str, Recording]] = []
    for path in args.runs:
        bar = progress_bar(f"reading {len(runs) + 1}/{len(args.runs)}", args.quiet, args.progress)
        try:
            run = resolve_run(path)
            runs.append((one_line(run.name or str(run)), read_recording(run, samples=True,
                                                                         ranks_done=bar.ranks if bar else None)))
        except RecordingError as exc:
            return _err("compare", str(exc))
        finally:
            if bar:
                bar.close()
    if len({name for name, _ in runs}) < len(runs):
        runs = [(f"{name} ({i + 1})", rec) for i, (name, rec) in enumerate(runs)]
    result = compare(runs, args.phase, args.price_per_hour)
    if args.format == "json":
        print(json.dumps({"phase": result.phase, "price_per_hour": result.price_per_hour,
                          "runs": [vars(r) for r in result.runs]}, indent=1, default=str))
        for name, rec in runs:
            if rec.skipped_lines:
                print(f"otelprof compare: note: {name}: {_skipped(rec)}", file=sys.stderr)
        return 0
    from otelprof.report.formatting import num, pct, secs

    def digits(n: int) -> Callable[[float | None], str]:
        return lambda v: num(v, n)

    formats: dict[str, Callable[[float | None], str]] = {
        "seconds": secs, "ratio": pct, "count": digits(6), "samples/s": digits(5), "currency": digits(4)}
    names = [r.name for r in result.runs]
    header = ["metric", *names, *(f"{n} vs {names[0]}" for n in names[1:])]
    rows = []
    for field, label, unit, _higher in METRICS:
        values = [getattr(r, field) for r in result.runs]
        if all(v is None for v in values):
            continue
        changes = [change(values[0], v) for v in values[1:]]
        rows.append([label, *(formats[unit](v) for v in values),
                     *(f"{c * 100:+.1f} %" if c is not None else "-" for c in changes)])
    if args.format == "markdown":
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        for row in (header, *rows):
            print("  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w)
                            for i, (x, w) in enumerate(zip(row, widths))))
    print(f"\nphase {one_line(result.phase)}; step times pool all ranks' steps; throughput adds the ranks' recorded "
          "samples per second of step time" + (f"; cost at {args.price_per_hour:g} per node-hour" if args.price_per_hour
                                       is not None else "; --price-per-hour adds the cost")
          + "".join(f"; {name}: {_skipped(rec)}" for name, rec in runs if rec.skipped_lines), file=sys.stderr)
    return 0


def write_demo_outputs(run_dir: Path) -> tuple[Path, Path]:
    """The demo's last step: report.html and trace.json next to the recording."""
    from otelprof.analysis.report import build_report, load
    from otelprof.report.html import render
    from otelprof.report.timeline import build_timeline, write_timeline

    recording = load(run_dir)
    report_path, trace_path = run_dir / "report.html", run_dir / "trace.json"
    report_path.write_text(render(build_report(recording)), encoding="utf-8")
    write_timeline(build_timeline(recording), trace_path)
    return report_path, trace_path


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add report, timeline, check and compare to the ``otelprof`` parser."""
    report = sub.add_parser(
        "report", help="write the profiling report (HTML or JSON) of a recording or of a job in Prometheus",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""Analyze a run recording and write one self-contained HTML page (or the same results as
JSON): job summary, system usage, framework breakdown, the offline checks, step durations, GPU
utilization, load balancing, data loading, batch size, CPU and I/O bottlenecks, GPU memory.

  otelprof report otelprof-runs/<run-id> -o report.html
  otelprof report otelprof-runs -o report.json              # the newest run; JSON because of the name
  otelprof report --prometheus http://prometheus:9090 --job resnet50 --from now-6h

RUN_DIR is a run directory (rank-*/ inside), one rank's directory, or a directory of runs.""")
    report.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="the recording")
    report.add_argument("-o", "--output", default=None, help="file to write (default: report.html / report.json)")
    report.add_argument("--format", choices=("html", "json"), default=None,
                        help="html (default) or json (default when -o ends in .json)")
    report.add_argument("--prometheus", default=None, metavar="URL", help="query this Prometheus instead")
    report.add_argument("--job", default=None, metavar="NAME", help="with --prometheus: the job_name label")
    report.add_argument("--from", dest="start", default=None, metavar="TIME",
                        help="with --prometheus: start (Unix seconds, ISO 8601, or now-6h; default: the job's start)")
    report.add_argument("--to", dest="end", default=None, metavar="TIME",
                        help="with --prometheus: end (default: the job's last step, or now)")
    report.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each Prometheus query")
    report.add_argument("--check-interval", type=float, default=None, metavar="SECONDS",
                        help="evaluate the checks every SECONDS (default: 10 s, coarser for long runs)")
    report.add_argument("--no-checks", action="store_true",
                        help="leave the offline checks out (they dominate the time on very long runs)")
    report.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    report.add_argument("--set", action="append", metavar="NAME=VALUE",
                        help="override a check threshold (a MixinConfig field, as for otelprof mixin), after "
                             "--config")
    report.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    report.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    report.set_defaults(func=cmd_report)

    timeline = sub.add_parser(
        "timeline", help="write a Chrome trace / Perfetto timeline of a recording",
        description="Write the recording as trace-event JSON for https://ui.perfetto.dev or chrome://tracing: a "
                    "process per rank (steps with outliers marked, regions, profiling windows, its CPU and memory) "
                    "and per node (CPU, I/O wait, memory and GPU counters). Long runs are cut to a window: "
                    f"--from-step/--to-step, else the first --max-steps steps per rank (default "
                    f"{2000}).")
    timeline.add_argument("run_dir", metavar="RUN_DIR", help="the recording")
    timeline.add_argument("-o", "--output", default="trace.json", help="file to write (default: trace.json)")
    timeline.add_argument("--from-step", type=int, default=None, metavar="N", help="first step number to include")
    timeline.add_argument("--to-step", type=int, default=None, metavar="N", help="last step number to include")
    timeline.add_argument("--steps", default=None, metavar="FIRST-LAST",
                          help="the steps FIRST to LAST (1000-1200; 1000- from 1000 on): --from-step/--to-step at once")
    timeline.add_argument("--ranks", default=None, metavar="LIST",
                          help="only these ranks, e.g. 0,3,8-15 (only their files are read; a node's counters come "
                               "with the rank that sampled it, its local rank 0)")
    timeline.add_argument("--phase", default="train", help="phase whose step numbers --from/--to-step mean")
    timeline.add_argument("--max-steps", type=int, default=None, metavar="N",
                          help="at most N steps per rank (default 2000 without --from/--to-step)")
    timeline.add_argument("--no-counters", action="store_true", help="leave out the CPU/GPU/memory counter tracks")
    timeline.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    timeline.set_defaults(func=cmd_timeline)

    check = sub.add_parser(
        "check", help="run the offline checks on a recording; exit 1 if any fires (for CI)",
        description="Evaluate every alert check that has an offline twin on the recording and print a table. "
                    "The diagnosis comes first: what costs this run time, ranked, with its figures and what to do. "
                    "Exit status: 0 none fired, 1 some fired, 2 bad input.")
    check.add_argument("run_dir", metavar="RUN_DIR", help="the recording")
    check.add_argument("--interval", type=float, default=None, metavar="SECONDS",
                       help="evaluate every SECONDS (default: 10 s, coarser for long runs)")
    check.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    check.add_argument("--set", action="append", metavar="NAME=VALUE",
                       help="override a threshold (a MixinConfig field, as for otelprof mixin), after --config")
    check.add_argument("--json", action="store_true",
                       help='print {"diagnosis": ..., "checks": [...]} as JSON')
    check.add_argument("--rules", action="append", metavar="FILE.py",
                       help="also run the check rules in Python of FILE.py (docs/tensors.md); repeatable")
    check.add_argument("--rule-timeout", default=None, metavar="SECONDS",
                       help="seconds each check rule may run (and its file take to load) before it is killed and "
                            "reported as timed out, exit status 2 (default: OTELPROF_RULE_TIMEOUT_SECONDS or 10)")
    check.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    check.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    check.set_defaults(func=cmd_check)

    cmp = sub.add_parser(
        "compare", help="compare runs before/after a change: duration, step times, throughput, utilization, cost",
        description="One column per run, and the change of each later run against the first.")
    cmp.add_argument("runs", nargs="+", metavar="RUN", help="two or more recordings")
    cmp.add_argument("--phase", default="train", help="phase whose steps are compared (default: train)")
    cmp.add_argument("--price-per-hour", type=float, default=None, metavar="PRICE",
                     help="price of one node for an hour: adds the cost of each run")
    cmp.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    cmp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    cmp.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    cmp.set_defaults(func=cmd_compare)
