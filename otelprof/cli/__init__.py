"""The ``otelprof`` command: thin argparse front over library functions.

The command-line tools live in this package: each command's module (``report``, ``generate``, ``demo``,
``actions`` for ``otelprof webhook``, ``launch`` and ``spawned_ranks`` for ``otelprof run``). They may import
every other package; nothing imports them but the command itself, ``python -m otelprof`` and ``otelprof run``'s
``sitecustomize``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from otelprof import environment_variables as ev
from otelprof._version import __version__
from otelprof.config import Config, ConfigError

EXIT_USAGE = 2


def _cmd_env(args: argparse.Namespace) -> int:
    if args.markdown:
        from otelprof.cli.generate import env_markdown

        print(env_markdown())
        return 0
    width = max(len(v.name) for v in ev.ENV_VARS)
    for var in ev.ENV_VARS:
        current = os.environ.get(var.name)
        if current is None:
            shown = "(unset)"
        elif var.secret:
            shown = "(set, hidden)" if current else "(empty)"
        else:
            shown = f"= {one_line(current)}"
        print(f"{var.name:<{width}}  {shown}")
        print(f"{'':<{width}}  default: {var.default or '(empty)'}")
        print(f"{'':<{width}}  {var.description}")
    from otelprof.config import unknown_variables

    for name in unknown_variables(os.environ):
        close = ev.closest(name)
        print(f"{one_line(name, 80)}  is not an otelprof setting: ignored"
              + (f" (did you mean {close}?)" if close else ""))
    return 0


def _cmd_catalog(args: argparse.Namespace) -> int:
    from otelprof import semconv

    if args.markdown:
        from otelprof.cli.generate import catalog_markdown

        print(catalog_markdown())
        return 0
    for m in semconv.METRICS:
        print(f"{m.query_name:<48} {m.kind.value:<9} {m.unit or '-':<8} {m.description}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from otelprof.cli.demo import run_demo, summarize

    result = run_demo(duration=args.duration, record_dir=args.record_dir)
    print(f"\nRecorded {result.steps} training steps ({result.backend}) in\n  {result.run_dir}")
    print(summarize(result.run_dir))
    print("\nWhat is there: manifest.json (run, resource, lifecycle), steps.jsonl (every step's timings),\n"
          "spans.jsonl and metrics.jsonl (OTLP-JSON), samples.jsonl (CPU, memory, GPU samples) and\n"
          "profiles.jsonl (operator-profiling windows). Next:\n"
          f"  otelprof env                      # every setting, e.g. to send OTLP or serve /metrics\n"
          f"  otelprof check {result.run_dir}    # the alert checks, offline\n"
          f"  otelprof compare RUN_A RUN_B      # before/after a change")
    from otelprof.cli.report import write_demo_outputs

    report, trace = write_demo_outputs(result.run_dir)
    print(f"\nReport (open in a browser):  {report}\n"
          f"Timeline (open in https://ui.perfetto.dev or chrome://tracing):  {trace}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otelprof.cli.generate import generate

    root = Path(args.root)
    if not (root / "docs" / "configuration.md").is_file():
        print(f"otelprof: {root} has no docs/configuration.md (run from the repository root or pass --root)",
              file=sys.stderr)
        return EXIT_USAGE
    changed = generate(root)
    for path in changed:
        print(f"updated {path}")
    if not changed:
        print("generated files are up to date")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    command = list(args.command_line)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("otelprof run: give the command to run, e.g. otelprof run -- python train.py", file=sys.stderr)
        return EXIT_USAGE
    bootstrap = str(Path(__file__).resolve().parent.parent / "_bootstrap")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap, env.get("PYTHONPATH", "")) if p)
    env["OTELPROF_RUN"] = "1"
    if args.no_torch:
        env["OTELPROF_RUN_TORCH"] = "0"
    if args.grad_norm:
        env["OTELPROF_RUN_GRAD_NORM"] = "1"
    if args.quiet:
        env[ev.OTELPROF_QUIET] = "true"
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"otelprof run: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


def _cmd_capture(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.request

    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    if not url.endswith("/v1/capture"):
        url += "/v1/capture"
    request = urllib.request.Request(url, data=json.dumps({"steps": args.steps}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    token = args.token or os.environ.get("OTELPROF_CONTROL_TOKEN", "")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            print(one_line(response.read().decode(errors="replace"), 4000))
            return 0
    except urllib.error.HTTPError as error:
        print(f"otelprof capture: {one_line(url)} answered {error.code}: "
              f"{one_line(error.read().decode(errors='replace'))}",
              file=sys.stderr)
    except (urllib.error.URLError, OSError) as error:
        print(f"otelprof capture: cannot reach {one_line(url)}: {one_line(str(error))}", file=sys.stderr)
    return 1


def _cmd_mixin(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otelprof.mixin.bundle import check, write
    from otelprof.mixin.bundle_files import RefusedWrite
    from otelprof.mixin.config import from_settings
    from otelprof.mixin.custom_alerts import load

    try:
        config = from_settings(args.config, args.set)
        if config.custom_rules:
            load(config.custom_rules)  # a bad rule file: one line, before anything is written
        check(config)  # every expression parsed, every template closed: Prometheus would refuse the whole file
    except ValueError as exc:
        print(f"otelprof mixin: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    try:
        changed = write(Path(args.out), config, force=args.force)
    except RefusedWrite as exc:
        print(f"otelprof mixin: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"otelprof mixin: cannot write {args.out}: {one_line(str(exc))}", file=sys.stderr)
        return 1
    for path in changed:
        print(f"wrote {path}")
    if not changed:
        print(f"{args.out} is up to date")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    import importlib.util
    import platform

    from otelprof.integrations import native

    print(f"otelprof {__version__} on Python {platform.python_version()} ({platform.system()} {platform.machine()})")
    torch_found = importlib.util.find_spec("torch") is not None
    hooks = native.status()
    print(f"PyTorch: {'installed' if torch_found else 'not installed (the PyTorch hooks are not used)'}")
    print(f"PyTorch hooks: {hooks.path} — {hooks.reason}")
    if args.require_native and native.load()[0] is None:
        print("otelprof doctor: the C extension is required (--require-native) but not installed", file=sys.stderr)
        return 1
    return 0


def _read_secret(path: str | None, env_name: str) -> str:
    from pathlib import Path

    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return os.environ.get(env_name, "").strip()


def _cmd_webhook(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from otelprof.cli import actions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        token = _read_secret(args.token_file, "OTELPROF_WEBHOOK_TOKEN")
        control_token = _read_secret(args.control_token_file, "OTELPROF_CONTROL_TOKEN")
        static = [actions.parse_target(item) for item in args.target or []]
        targets = actions.TargetMap(static, Path(args.targets_file) if args.targets_file else None)
        if args.targets_file:
            actions.parse_targets_text(Path(args.targets_file).read_text(encoding="utf-8"))
    except (OSError, actions.TargetError) as exc:
        print(f"otelprof webhook: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if not token:
        print("otelprof webhook: a bearer token is required: set OTELPROF_WEBHOOK_TOKEN or --token-file",
              file=sys.stderr)
        return EXIT_USAGE
    from otelprof.runtime.tokens import is_placeholder, placeholder_message

    for value, setting in ((token, "the webhook token (OTELPROF_WEBHOOK_TOKEN or --token-file)"),
                           (control_token, "the control token (OTELPROF_CONTROL_TOKEN or --control-token-file)")):
        if is_placeholder(value):
            print(f"otelprof webhook: {placeholder_message(setting)}", file=sys.stderr)
            return EXIT_USAGE
    kubernetes = None
    if args.suspend_jobs:
        try:
            kubernetes = actions.KubernetesJobs.in_cluster(timeout=args.timeout)
        except OSError as exc:
            print(f"otelprof webhook: --suspend-jobs needs the pod's service account: {exc}", file=sys.stderr)
            return EXIT_USAGE
    receiver = actions.WebhookReceiver(token, targets, control_token, capture_steps=args.capture_steps,
                                       max_body=args.max_body, timeout=args.timeout, dry_run=args.dry_run,
                                       control_port_base=args.control_port_base, kubernetes=kubernetes)
    server = actions.WebhookServer(receiver)
    try:
        server.listen(args.host, args.port)
    except OSError as exc:
        print(f"otelprof webhook: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    assert server.address is not None
    logging.getLogger("otelprof.webhook").info(
        "listening on http://%s:%d%s (%d static targets%s)", *server.address, actions.PATH, len(static),
        f", file {args.targets_file}" if args.targets_file else "")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _add_alerting_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser(
        "doctor", help="say how otelprof is installed: version, and whether the PyTorch hooks run in C or Python",
        description="Print the otelprof version and platform, and which PyTorch hooks a training process "
                    "started from this environment uses: the C extension, or the Python hooks and why "
                    "(extension not installed, or disabled by OTELPROF_TORCH_NATIVE).")
    doctor.add_argument("--require-native", action="store_true",
                        help="exit 1 when the C extension is not installed (for wheel and image checks)")
    doctor.set_defaults(func=_cmd_doctor)

    mixin = sub.add_parser(
        "mixin", help="write the whole mixin with your settings: rules, PrometheusRule, runbook, Grafana "
                      "dashboards, provisioning and ConfigMaps",
        description="Write into DIR, from the installed package and the mixin config "
                    "(otelprof.mixin.config.MixinConfig) with your overrides: otelprof-alerts.yaml, "
                    "otelprof-rules.yaml, otelprof-prometheusrule.yaml, runbook.md (serve it and set runbook_url; "
                    "the default links to the project's runbook), tests/ (promtool rule tests), "
                    "dashboards/*.json, dashboards/provisioning/ (dashboard provider, data sources), "
                    "kubernetes/ (dashboard and data-source ConfigMaps, AlertmanagerConfig, kube-prometheus-stack "
                    "values, PodMonitor, training Job), otel-collector/ and prometheus/ (plain Prometheus: "
                    "scrape config, Alertmanager config). The selector and windows reach the dashboards' "
                    "queries too.",
        epilog="Example: otelprof mixin -o monitoring/ --set 'selector=namespace=\"ml\"' "
               "--set prometheus_rule_release=monitoring --set runbook_url=https://wiki.example.com/otelprof/runbook "
               "--set disabled_alerts=Overfitting; or --config mixin.yaml with the same names as keys.")
    mixin.add_argument("-o", "--out", required=True, metavar="DIR", help="directory to write the files into")
    mixin.add_argument("--force", action="store_true",
                       help="replace files in DIR that otelprof did not write (never writes through links)")
    mixin.add_argument("--config", metavar="FILE",
                       help="YAML or JSON file of settings (MixinConfig field: value; docs/mixin-settings.md), "
                            "applied before --set")
    mixin.add_argument("--set", action="append", metavar="NAME=VALUE",
                       help="override a MixinConfig field (repeatable); tuples are comma lists, "
                            "actions are ALERT:ACTION,...")
    mixin.set_defaults(func=_cmd_mixin)

    webhook = sub.add_parser(
        "webhook", help="Alertmanager webhook receiver: stop or profile the training process an alert names",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""Receive Alertmanager notifications on POST /v1/alerts (GET /healthz for probes) and act on
firing alerts that carry an `action` label: `stop` asks the training process named by the alert's
job_name and rank labels to stop at its next step boundary (after its on_stop callbacks);
`capture` arms a profiling window of --capture-steps steps. No other process is touched.

Requests need `Authorization: Bearer <token>` (OTELPROF_WEBHOOK_TOKEN or --token-file); oversized
or malformed payloads and unknown payload versions are refused with 413/400 and change nothing.
Alertmanager is answered at once (202): actions wait in bounded per-target queues and are retried
while a control endpoint cannot be reached; an action that already succeeded for an alert is not
repeated. Decisions are logged; outcomes are logged and counted on GET /metrics.

Targets map jobs and ranks to control endpoints (OTELPROF_CONTROL_PORT of the training process):
  --target resnet=http://10.0.0.5:9470          every rank of job resnet (or its only process)
  --target resnet/3=http://10.0.0.8:9470        rank 3 of job resnet
  --target '*=http://{job_name}-{rank}.{job_name}:9470'   placeholders from the alert's labels
--targets-file takes the same entries one per line (`JOB/RANK: URL` lines, i.e. a flat YAML
mapping, work too) and is re-read when it changes, e.g. a mounted ConfigMap.""")
    webhook.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    webhook.add_argument("--port", type=int, default=9095, help="port to listen on (default: 9095)")
    webhook.add_argument("--token-file", default=None, help="file holding the bearer token Alertmanager sends "
                                                             "(default: OTELPROF_WEBHOOK_TOKEN)")
    webhook.add_argument("--target", action="append", metavar="JOB[/RANK]=URL", help="control endpoint (repeatable)")
    webhook.add_argument("--targets-file", default=None, metavar="FILE", help="targets, one per line")
    webhook.add_argument("--control-token-file", default=None,
                         help="file holding the control endpoints' token (default: OTELPROF_CONTROL_TOKEN)")
    webhook.add_argument("--capture-steps", type=int, default=20, help="steps a capture profiles (default: 20)")
    webhook.add_argument("--max-body", type=int, default=1024 * 1024, help="largest payload in bytes (default 1 MiB)")
    webhook.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for a control endpoint")
    webhook.add_argument("--dry-run", action="store_true", help="log what would be done, send nothing")
    webhook.add_argument("--control-port-base", type=int, default=None, metavar="PORT",
                         help="fill {control_port} in target URLs with PORT + the alert's local_rank, e.g. "
                              "--target '*=http://{pod_ip}:{control_port}' --control-port-base 9565")
    webhook.add_argument("--suspend-jobs", action="store_true",
                         help="in Kubernetes: when a stop reaches no training process, suspend the Job named by "
                              "the alert's job_name in its namespace (RBAC: get/patch jobs)")
    webhook.set_defaults(func=_cmd_webhook)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otelprof",
        description="Training-job profiling on OpenTelemetry and Prometheus. In a training script use the "
                    "library (import otelprof; otelprof.init(); with otelprof.step(): ...), or start an "
                    "unmodified script under 'otelprof run'. This command also reads what a run recorded "
                    "(report, check, compare, timeline), writes the Prometheus mixin (mixin), acts on "
                    "Alertmanager notifications (webhook) and lists settings and metrics (env, catalog).",
        epilog="Settings come from OTEL_* and OTELPROF_* environment variables: see 'otelprof env'.",
    )
    parser.add_argument("--version", action="version", version=f"otelprof {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an unexpected error print the traceback (otherwise one line), and log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    env = sub.add_parser("env", help="list every environment variable with its default and current value",
                         description="List every environment variable otelprof reads, its default, current "
                                     "value and meaning. Exits 2 if a current value is invalid.")
    env.add_argument("--markdown", action="store_true", help="print the Markdown table of docs/configuration.md")
    env.set_defaults(func=_cmd_env)

    catalog = sub.add_parser("catalog", help="list every metric otelprof exports",
                             description="List every metric: the name to query in Prometheus (counters end in "
                                         "_total), kind, unit and meaning.")
    catalog.add_argument("--markdown", action="store_true", help="print the Markdown table of docs/catalog.md")
    catalog.set_defaults(func=_cmd_catalog)

    generate = sub.add_parser("generate", help="regenerate the repository's generated files",
                              description="Rewrite generated files (the configuration and metric tables in docs/, "
                                          "the Prometheus rules and runbook in deploy/prometheus/, the "
                                          "Grafana dashboards and provisioning in dashboards/) from the catalog, "
                                          "the settings module, the mixin and otelprof/dashboards/.")
    generate.add_argument("--root", default=".", help="repository root (default: current directory)")
    generate.set_defaults(func=_cmd_generate)

    run = sub.add_parser(
        "run", help="run a training command with otelprof and PyTorch instrumented automatically",
        description="Run COMMAND with otelprof started before the program's own code (a sitecustomize module "
                    "put first on PYTHONPATH) and, when PyTorch is importable, every optimizer, top-level module "
                    "call and DataLoader hooked: steps end at optimizer.step(); a Hugging Face or Lightning Trainer "
                    "gets otelprof's callback, DDP models their all-reduce timed. Rank 0 says on stderr where the "
                    "recording goes and, at the exit, how to report it. Settings come from the usual "
                    "OTEL_*/OTELPROF_* variables. Works with torchrun: otelprof run -- torchrun ... train.py.")
    run.add_argument("--no-torch", action="store_true", help="only start otelprof; do not hook PyTorch")
    run.add_argument("--grad-norm", action="store_true", help="also record the global gradient norm")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="no start and exit lines on stderr (OTELPROF_QUIET=true); warnings still show")
    run.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    run.set_defaults(func=_cmd_run)

    capture = sub.add_parser(
        "capture", help="arm an operator-profiling window in a running training process",
        description="Ask a training process's control endpoint (OTELPROF_CONTROL_PORT) to profile the next "
                    "N steps with torch.profiler (or, without PyTorch, to trace them as spans).")
    capture.add_argument("url", help="control endpoint, e.g. http://10.0.0.5:9565 or 127.0.0.1:9565")
    capture.add_argument("--steps", type=int, default=10, help="steps to profile (default: 10)")
    capture.add_argument("--token", default=None, help="bearer token (default: OTELPROF_CONTROL_TOKEN)")
    capture.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer")
    capture.set_defaults(func=_cmd_capture)

    _add_alerting_commands(sub)

    from otelprof.cli.report import add_commands

    add_commands(sub)  # report, timeline, check, compare

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
    if args.command == "capture" and not 1 <= args.steps <= 10_000:
        parser.error("--steps must be from 1 to 10000")
    if args.command == "webhook" and not 1 <= args.capture_steps <= 10_000:
        parser.error("--capture-steps must be from 1 to 10000")
    try:
        if args.command != "run":  # under run, the program's own init() warns once and keeps the default
            Config.from_env(strict=True)
    except ConfigError as exc:
        print(f"otelprof: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        print(f"otelprof {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (otelprof check | head)
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_USAGE
    except Exception as exc:  # a last resort: known bad input is reported where it is found
        if args.debug:
            traceback.print_exc()
        print(f"otelprof {args.command}: internal error: {one_line(f'{type(exc).__name__}: {exc}')}"
              + ("" if args.debug else f" (otelprof --debug {args.command} ... shows where)"), file=sys.stderr)
        return EXIT_USAGE
    return result


def one_line(text: str, limit: int = 300) -> str:
    """``text`` fit for a one-line message: control characters (newlines, terminal escapes) escaped, cut
    at ``limit`` characters."""
    from otelprof._log import escape

    return escape(text, limit)


if __name__ == "__main__":
    sys.exit(main())
