"""The ``otelprof`` command: thin argparse front over library functions."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from otelprof import environment_variables as ev
from otelprof._version import __version__
from otelprof.config import Config, ConfigError

EXIT_USAGE = 2


def _cmd_env(args: argparse.Namespace) -> int:
    if args.markdown:
        print(env_markdown())
        return 0
    width = max(len(v.name) for v in ev.ENV_VARS)
    for var in ev.ENV_VARS:
        current = os.environ.get(var.name)
        shown = f"= {current}" if current is not None else "(unset)"
        print(f"{var.name:<{width}}  {shown}")
        print(f"{'':<{width}}  default: {var.default or '(empty)'}")
        print(f"{'':<{width}}  {var.description}")
    return 0


def env_markdown() -> str:
    """The README's configuration table."""
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for var in ev.ENV_VARS:
        description = var.description.replace("|", "\\|")
        rows.append(f"| `{var.name}` | {var.default or '(empty)'} | {description} |")
    return "\n".join(rows)


def catalog_markdown() -> str:
    """The README's metric catalog table."""
    from otelprof import semconv

    rows = ["| OTel name | Prometheus name | Kind | Unit | Labels (besides job_name, rank, local_rank, node) "
            "| Meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for m in semconv.METRICS:
        prom = m.prometheus_name + ("_total" if m.kind is semconv.Kind.COUNTER else "")
        rows.append(f"| `{m.name}` | `{prom}` | {m.kind.value} | {m.unit or '-'} | "
                    f"{', '.join(m.labels) or '-'} | {m.description} |")
    return "\n".join(rows)


def _cmd_catalog(args: argparse.Namespace) -> int:
    from otelprof import semconv

    if args.markdown:
        print(catalog_markdown())
        return 0
    for m in semconv.METRICS:
        print(f"{m.prometheus_name:<44} {m.kind.value:<9} {m.unit or '-':<8} {m.description}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from otelprof.demo import run_demo, summarize

    result = run_demo(duration=args.duration, record_dir=args.record_dir)
    print(f"\nRecorded {result.steps} training steps ({result.backend}) in\n  {result.run_dir}")
    print(summarize(result.run_dir))
    print("\nWhat is there: manifest.json (run, resource, lifecycle), steps.jsonl (every step's timings),\n"
          "spans.jsonl and metrics.jsonl (OTLP-JSON). Next:\n"
          f"  otelprof env                      # every setting, e.g. to send OTLP or serve /metrics\n"
          f"  less {result.run_dir}/rank-0/steps.jsonl")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otelprof.generate import generate

    root = Path(args.root)
    if not (root / "README.md").is_file():
        print(f"otelprof: {root} has no README.md (run from the repository root or pass --root)", file=sys.stderr)
        return EXIT_USAGE
    changed = generate(root)
    for path in changed:
        print(f"updated {path}")
    if not changed:
        print("generated files are up to date")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otelprof",
        description="Training-job profiling on OpenTelemetry and Prometheus. In a training script use the "
                    "library (import otelprof; otelprof.init(); with otelprof.step(): ...); this command "
                    "runs the demo and inspects settings.",
        epilog="Settings come from OTEL_* and OTELPROF_* environment variables: see 'otelprof env'.",
    )
    parser.add_argument("--version", action="version", version=f"otelprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    env = sub.add_parser("env", help="list every environment variable with its default and current value",
                         description="List every environment variable otelprof reads, its default, current "
                                     "value and meaning. Exits 2 if a current value is invalid.")
    env.add_argument("--markdown", action="store_true", help="print the README's Markdown table")
    env.set_defaults(func=_cmd_env)

    catalog = sub.add_parser("catalog", help="list every metric otelprof exports",
                             description="List every metric: Prometheus name, kind, unit and meaning.")
    catalog.add_argument("--markdown", action="store_true", help="print the README's Markdown table")
    catalog.set_defaults(func=_cmd_catalog)

    generate = sub.add_parser("generate", help="regenerate the repository's generated files",
                              description="Rewrite generated files (the README's configuration and metric "
                                          "tables) from the catalog and the settings module.")
    generate.add_argument("--root", default=".", help="repository root (default: current directory)")
    generate.set_defaults(func=_cmd_generate)

    demo = sub.add_parser("demo", help="train a small model on synthetic data and record it locally",
                          description="Train a small model (PyTorch if installed) on synthetic data on the CPU "
                                      "through the otelprof API, write a run recording and summarize it.")
    demo.add_argument("--duration", type=float, default=30.0, metavar="SECONDS",
                      help="how long to train (default: 30)")
    demo.add_argument("--record-dir", default=None, metavar="DIR",
                      help="where to write the recording (default: OTELPROF_RECORD_DIR or ./otelprof-runs)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "duration", 1.0) is not None and getattr(args, "duration", 1.0) <= 0:
        parser.error("--duration must be positive")
    try:
        Config.from_env(strict=True)
    except ConfigError as exc:
        print(f"otelprof: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
