"""Generated artifacts, kept in the repository and checked for staleness by the tests.

The configuration and metric tables in ``docs/configuration.md`` and ``docs/catalog.md``, the mixin settings'
tables in ``docs/mixin-settings.md`` (:mod:`otelprof.mixin.settings_doc`), the alerts table in
``docs/alerts.md`` (from the alerts' declarations), the
Prometheus mixin's files under ``deploy/prometheus/`` (alerts, recording rules, PrometheusRule,
runbook) with the default mixin config, the Grafana dashboards and provisioning under ``dashboards/``, and in a
source checkout the promtool cases of every alert (``tests/rules/*_test.yaml``). ``otelprof generate`` rewrites
them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

DOC_BLOCKS: dict[str, tuple[str, ...]] = {
    "docs/configuration.md": ("env",),
    "docs/catalog.md": ("catalog", "webhook_catalog", "attributes"),
    "docs/mixin-settings.md": ("mixin_alerts", "mixin_settings"),
    "docs/alerts.md": ("alerts",),
}
"""Each Markdown file with generated blocks (path from the repository root), and the blocks it holds."""


def _renderers() -> dict[str, Callable[[], str]]:
    from otelprof.mixin import settings_doc

    return {"env": env_markdown, "catalog": catalog_markdown, "webhook_catalog": webhook_catalog_markdown,
            "attributes": attributes_markdown, "mixin_alerts": settings_doc.alerts_markdown,
            "mixin_settings": settings_doc.settings_markdown, "alerts": alerts_markdown}


def env_markdown() -> str:
    """The configuration table of docs/configuration.md."""
    from otelprof import environment_variables as ev

    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for var in ev.ENV_VARS:
        description = var.description.replace("|", "\\|")
        rows.append(f"| `{var.name}` | {var.default or '(empty)'} | {description} |")
    return "\n".join(rows)


def catalog_markdown() -> str:
    """The metric catalog table of docs/catalog.md."""
    from otelprof import semconv

    rows = ["| OTel name | Prometheus name | Kind | OTel instrument | Unit "
            "| Labels (besides job_name, rank, local_rank, node) | Meaning |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for m in semconv.METRICS:
        prom = m.query_name
        rows.append(f"| `{m.name}` | `{prom}` | {m.kind.value} | {m.instrument} | {m.unit or '-'} | "
                    f"{', '.join(m.labels) or '-'} | {m.description} |")
    return "\n".join(rows)


def webhook_catalog_markdown() -> str:
    """The table of ``otelprof webhook``'s own series (its ``GET /metrics``) in docs/catalog.md."""
    from otelprof import semconv

    rows = ["| OTel name | Prometheus name | Kind | Unit | Labels | Meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for m in semconv.WEBHOOK_METRICS:
        prom = m.query_name
        rows.append(f"| `{m.name}` | `{prom}` | {m.kind.value} | {m.unit or '-'} | {', '.join(m.labels) or '-'} | "
                    f"{m.description} |")
    return "\n".join(rows)


def attributes_markdown() -> str:
    """The attribute table of docs/catalog.md: every resource, span and metric attribute and what it means."""
    from otelprof.semconv_attributes import ATTRIBUTES

    rows = ["| Attribute | On | Meaning |", "| --- | --- | --- |"]
    for a in ATTRIBUTES:
        rows.append(f"| `{a.name}` | {a.where} | {a.description.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def alerts_markdown() -> str:
    """The alerts table of docs/alerts.md, from the alerts' declarations."""
    from otelprof.mixin.alerts_table import alerts_markdown as table

    return table()


def render_blocks(text: str, names: tuple[str, ...]) -> str:
    """``text`` with each named ``<!-- BEGIN name -->...<!-- END name -->`` block regenerated."""
    renderers = _renderers()
    for name in names:
        render = renderers[name]
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"no <!-- BEGIN {name} --> block")
        text = pattern.sub(lambda m, r=render: m.group(1) + r() + "\n" + m.group(2), text)  # type: ignore[misc]
    return text


def generate(root: Path) -> list[Path]:
    """Rewrite the generated files under ``root``; return the ones that changed."""
    changed = []
    for relative, names in DOC_BLOCKS.items():
        doc = root / relative
        old = doc.read_text(encoding="utf-8")
        new = render_blocks(old, names)
        if new != old:
            doc.write_text(new, encoding="utf-8")
            changed.append(doc)
    from otelprof.mixin import MixinConfig
    from otelprof.mixin import write as write_mixin
    from otelprof.mixin.generate import PROMETHEUS_DIR

    changed.extend(write_mixin(root / PROMETHEUS_DIR, MixinConfig()))
    from otelprof.mixin import rulers

    changed.extend(rulers.write(root))  # the same rules in the layout Mimir's ruler loads
    from otelprof.dashboards.generate import write as write_dashboards

    changed.extend(write_dashboards(root))  # before the deploy copies, which embed the dashboards
    return changed + _generate_deploy(root) + _generate_rule_tests(root)


RULE_CASES = "tests.rules.cases"
"""The promtool cases of every alert (``tests/rules/*_test.yaml``), written by this module of a source checkout."""


def _generate_rule_tests(root: Path) -> list[Path]:
    """The promtool test files of a source checkout (none without its ``tests/``: an installed package). They are
    written by the checkout's own module, in a process of their own, so its ``tests`` package is the one read."""
    import subprocess
    import sys

    if not (root / Path(*RULE_CASES.split(".")).with_suffix(".py")).is_file():
        return []
    done = subprocess.run([sys.executable, "-m", RULE_CASES], cwd=root, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{RULE_CASES} failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return [Path(line.removeprefix("updated ")) for line in done.stdout.splitlines() if line.startswith("updated ")]


def _generate_deploy(root: Path) -> list[Path]:
    """Last: the Kubernetes copies of everything generated above."""
    from otelprof.mixin.deploy import generate as generate_deploy

    return generate_deploy(root)
