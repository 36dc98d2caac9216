"""The wheel: built from this checkout, it is tagged for this interpreter and platform, carries the C
extension and the Python hooks beside it and the PEP 561 marker, requires only what the package imports, and
`otelprof doctor` run from it names the hook path -- C, or Python and why when the extension is gone or turned off."""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from otelprof.mixin import MixinConfig
from otelprof.mixin.config import with_overrides
from tests.servers import Prometheus, free_port, prometheus, require_binary
from tests.test_alertmanager_config import AM_NAMESPACE, CLUSTER_ALERTS, TYPICAL_CLUSTER, _ours, _routes, _write, merged
from tests.test_dashboards_prometheus import DEMO, SCRAPE, _get, _run_window, substitute
from tests.test_deploy import CRD_DIR, CRD_FILES, _Loader

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = "otelprof/integrations/_torch_native"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                             "--no-cache-dir", "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    [path] = out.glob("*.whl")
    return path


def test_wheel_is_tagged_for_this_interpreter_and_carries_both_hook_paths(wheel: Path) -> None:
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name.endswith(f"-cp{version}-cp{version}-{platform}.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith(EXTENSION) and n.endswith(sysconfig.get_config_var("EXT_SUFFIX"))]
    assert "otelprof/integrations/torch.py" in names and "otelprof/integrations/native.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    assert "otelprof/py.typed" in names  # PEP 561: type checkers read the package's annotations


def test_every_runtime_dependency_is_imported_by_the_package(wheel: Path) -> None:
    """What `pip install otelprof` pulls in is what the package imports: no dependency only the tests use."""
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)[^;\n]*$", archive.read(metadata).decode(), re.M)
    imported: set[str] = set()
    for source in (ROOT / "otelprof").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    def provides(dist: str) -> set[str]:
        """The module paths a distribution installs (opentelemetry is a namespace that many share)."""
        return {".".join(Path(str(f)).with_suffix("").parts).removesuffix(".__init__")
                for f in importlib.metadata.files(dist) or [] if str(f).endswith(".py")}

    def used(dist: str, depth: int = 0) -> bool:
        if imported & provides(dist):
            return True
        # a meta-package (opentelemetry-exporter-otlp) is used through what it requires
        nested = re.findall(r"^([A-Za-z0-9_.-]+)[^;]*$", "\n".join(importlib.metadata.requires(dist) or []), re.M)
        return depth < 1 and any(used(n, depth + 1) for n in nested)

    assert requires and "prometheus-client" not in {normal(r) for r in requires}
    unused = sorted(r for r in requires if not used(r))
    assert not unused, f"declared runtime dependencies the package never imports: {unused}"


def _doctor(site: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTELPROF_") and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "otelprof", "doctor", "--require-native"], cwd=cwd,
                          env={**clean, "PYTHONPATH": str(site), **env}, capture_output=True, text=True, timeout=60)


def test_doctor_names_the_hook_path_of_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                             "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr

    installed = _doctor(site, tmp_path)
    assert installed.returncode == 0, installed.stderr
    assert "PyTorch hooks: C" in installed.stdout and str(site) in installed.stdout, installed.stdout

    disabled = _doctor(site, tmp_path, OTELPROF_TORCH_NATIVE="false")
    assert disabled.returncode == 0
    assert "PyTorch hooks: Python" in disabled.stdout and "disabled by OTELPROF_TORCH_NATIVE" in disabled.stdout

    # the wheel without its extension (what a source install without a compiler gives)
    [extension] = (site / "otelprof/integrations").glob("_torch_native*" + sysconfig.get_config_var("EXT_SUFFIX"))
    extension.unlink()
    missing = _doctor(site, tmp_path)
    assert "PyTorch hooks: Python" in missing.stdout and "is not installed" in missing.stdout, missing.stdout
    assert missing.returncode == 1 and "--require-native" in missing.stderr
    assert "Traceback" not in missing.stderr


# ------------------------------------------------------------------ a platform team adopts otelprof from the wheel
#
# Done when a platform team can adopt otelprof from its wheel alone.
#
# The wheel (pip wheel, above) and the sdist are built from this tree offline. The wheel goes
# into a fresh virtual environment without this checkout or the system's site-packages: only otelprof comes
# from the wheel; its three dependencies (opentelemetry-sdk, opentelemetry-exporter-otlp, psutil) are read
# from the test's own environment through a path entry, since nothing may be downloaded here. From a
# directory holding nothing of the repository, ``otelprof mixin -o DIR`` writes the bundle for the default
# settings and for overridden windows, and every file is checked: promtool (rules and the bundle's own rule
# tests), amtool (the plain-Prometheus config, and the AlertmanagerConfig merged into a typical cluster's
# config), the operator's CRD schemas where present, Kubernetes schemas, Grafana's dashboard schema, and
# every dashboard query against a live Prometheus that scraped a real run and evaluated each bundle's
# recording rules: with any window, the same panels return data as with the defaults.

GRAFANA_SCHEMA = json.loads((ROOT / "tests/fixtures/grafana-dashboard.schema.json").read_text(encoding="utf-8"))
FAST = "recording_interval="
"""The recording groups at Prometheus's global interval (1 s here), not every 30 s: the run lasts seconds."""
SETTINGS = {
    "default": [FAST],
    "window-5m": [FAST, "window=5m"],
    "all-windows": [FAST, "window=90s", "straggler_window=2m", "input_bound_window=3m", "step_outlier_window=7m"],
}
DURATION = 12.0


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    # setuptools' PEP 517 backend, no isolation (offline); build_meta rewrites sys.argv: read the directory first
    build = "import sys\nfrom setuptools import build_meta as b\nout = sys.argv[1]\nprint(b.build_sdist(out))\n"
    _run([sys.executable, "-c", build, str(out)], cwd=ROOT)
    [path] = out.glob("*.tar.gz")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("pip-user")
    env_dir = home / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
          "--disable-pip-version-check", str(wheel)], env=_env())  # no PYTHONPATH: this checkout must not count
    from importlib.metadata import distribution

    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = {str(Path(str(distribution(name).locate_file(""))).resolve())
            for name in ("opentelemetry-sdk", "opentelemetry-exporter-otlp", "psutil")}
    (site / "otelprof-test-deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return env_dir


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_the_wheel_carries_the_license_metadata_and_packaged_files(wheel: Path, venv: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {f"otelprof/mixin/files/{n}" for n in ("podmonitor.yaml", "training-job.yaml",
                                                   "otel-collector-config.yaml", "alertmanager.yml")} <= set(names)
    probe = ("import importlib.metadata as m, otelprof\nmd = m.metadata('otelprof')\n"
             "print(otelprof.__file__)\nprint(md['License-Expression'])\n"
             "print('\\n'.join(md.get_all('Project-URL') or []))\nprint(len(md.get_all('Classifier') or []))")
    lines = _run([str(venv / "bin/python"), "-c", probe], cwd=venv.parent, env=_env()).stdout.splitlines()
    assert lines[0].startswith(str(venv)), lines[0]  # the wheel's otelprof, not the checkout's
    assert lines[1] == "Apache-2.0"
    assert any(line.startswith("Source, https://") for line in lines[2:-1]), lines
    assert int(lines[-1]) >= 10


def test_the_sdist_holds_what_its_tests_need(sdist: Path, tmp_path: Path) -> None:
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    [tree] = tmp_path.iterdir()
    for relative in ("LICENSE", "tests/conftest.py", "tests/servers.py", "tests/rules/cases.py",
                     "tests/fixtures/grafana-dashboard.schema.json", "dashboards/otelprof-ranks.json",
                     "deploy/alertmanager/alertmanager.yml", "docs/deploy.md", "otelprof/mixin/files/podmonitor.yaml"):
        assert (tree / relative).is_file(), relative
    assert not list(tree.rglob("*.so"))
    env = {**_env(), "PYTHONPATH": str(tree)}
    collected = _run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                     cwd=tree, env=env).stdout
    assert int(collected.strip().splitlines()[-1].split()[0]) > 500, collected[-500:]
    ran = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_alertmanager_config.py"],
               cwd=tree, env=env)
    assert " passed" in ran.stdout and "failed" not in ran.stdout


def _schema(kind: str) -> dict[str, Any] | None:
    path = CRD_DIR / CRD_FILES[kind]
    if not path.is_file():
        return None  # CRD schemas sit beside the repository in CI; the rest of the bundle is still checked
    crd = yaml.load(path.read_text(), Loader=_Loader)
    [version] = [v for v in crd["spec"]["versions"] if v["name"] in ("v1", "v1alpha1")]
    return dict(version["schema"]["openAPIV3Schema"])


def _check_bundle(bundle: Path, config: MixinConfig, tmp_path: Path) -> None:
    import kubernetes_validate

    promtool, amtool = require_binary("promtool"), require_binary("amtool")
    _run([promtool, "check", "rules", "otelprof-alerts.yaml", "otelprof-rules.yaml"], cwd=bundle)
    tested = _run([promtool, "test", "rules", "otelprof-rules-test.yaml"], cwd=bundle / "tests")
    assert "SUCCESS" in tested.stdout
    _run([amtool, "check-config", "prometheus/alertmanager.yml"], cwd=bundle)
    scrape = yaml.safe_load((bundle / "prometheus/prometheus.yml").read_text())
    for job in scrape["scrape_configs"]:  # Debian's promtool is built without Kubernetes discovery
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9464"]}]
    (bundle / "prometheus/check.yml").write_text(yaml.safe_dump(scrape))
    _run([promtool, "check", "config", "prometheus/check.yml"], cwd=bundle)  # the rule files it names load too
    (bundle / "prometheus/check.yml").unlink()
    # kube-prometheus-stack: the cluster's alerts route as before, otelprof's reach otelprof's receivers
    [amc] = [d for d in yaml.load_all((bundle / "kubernetes/alertmanagerconfig.yaml").read_text(), Loader=_Loader)
             if d]
    after = _write(tmp_path, "merged.yaml", merged(TYPICAL_CLUSTER, amc, AM_NAMESPACE,
                                                   "OnNamespaceExceptForAlertmanagerNamespace"))
    for labels, receivers in CLUSTER_ALERTS:
        assert _routes(after, labels) == receivers, labels
    assert _ours(_routes(after, ["alertname=OtelprofNonFiniteValues", "severity=critical", "action=stop"])) == \
        ["otelprof-actions", "otelprof-page"]
    custom = [amc]
    for name in ("otelprof-prometheusrule.yaml", "kubernetes/podmonitor.yaml"):
        custom += [d for d in yaml.safe_load_all((bundle / name).read_text()) if d]
    for doc in custom:
        schema = _schema(doc["kind"])
        if schema is not None:
            jsonschema.validators.validator_for(schema)(schema).validate(doc)
    assert all(doc["metadata"]["labels"]["release"] == config.prometheus_rule_release for doc in custom[1:])
    for name in ("grafana-dashboards.yaml", "grafana-datasources.yaml", "grafana-provisioning.yaml",
                 "training-job.yaml"):
        for doc in yaml.safe_load_all((bundle / "kubernetes" / name).read_text()):
            if doc:
                kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    values = yaml.safe_load((bundle / "kubernetes/kube-prometheus-stack-values.yaml").read_text())
    assert values["grafana"]["sidecar"]["dashboards"]["folderAnnotation"] == "grafana_folder"
    assert values["grafana"]["sidecar"]["datasources"]["exemplarTraceIdDestinations"]["datasourceUid"] == "tempo"
    assert "alertmanagerConfigSelector" in values["alertmanager"]["alertmanagerSpec"]
    collector = yaml.safe_load((bundle / "otel-collector/config.yaml").read_text())
    assert collector["service"]["pipelines"]
    for board in (bundle / "dashboards").glob("*.json"):
        doc = json.loads(board.read_text())
        jsonschema.Draft7Validator(GRAFANA_SCHEMA).validate(doc)
        names = [v["name"] for v in doc["templating"]["list"]]
        assert {"cluster", "namespace", "job_name"} <= set(names), names
    alerts = yaml.safe_load((bundle / "otelprof-alerts.yaml").read_text())
    for rule in (r for g in alerts["groups"] for r in g["rules"]):
        assert rule["annotations"]["runbook_url"].startswith(config.runbook_url + "#"), rule["alert"]


def _targets(bundle: Path) -> dict[tuple[str, int, str], tuple[str, bool]]:
    out = {}
    for board in sorted((bundle / "dashboards").glob("*.json")):
        doc = json.loads(board.read_text())
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                if target.get("datasource", {}).get("type") == "prometheus":
                    out[(doc["uid"], panel["id"], target["refId"])] = (target["expr"], bool(target.get("instant")))
    return out


def _records_read(bundle: Path) -> set[str]:
    """Recording-rule names the bundle's dashboards query."""
    return {name for expr, _ in _targets(bundle).values() for name in re.findall(r"\botelprof:\w+:\w+", expr)}


def _query_all(prom: Prometheus, targets: dict[tuple[str, int, str], tuple[str, bool]], start: float, end: float,
               range_s: int) -> tuple[set[tuple[str, int, str]], list[str]]:
    with_data, errors = set(), []
    for key, (expr, instant) in targets.items():
        query = substitute(expr, range_s)
        if instant:
            body = _get(prom, "/api/v1/query", {"query": query, "time": str(end)})
        else:
            body = _get(prom, "/api/v1/query_range", {"query": query, "start": str(start), "end": str(end),
                                                      "step": str(int(SCRAPE))})
        if body.get("status") != "success":
            errors.append(f"{key}: {body.get('error')}\n    {query}")
        elif body["data"]["result"]:
            with_data.add(key)
    return with_data, errors


def test_a_pip_user_gets_a_working_bundle_for_any_window(venv: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "platform-team"
    cwd.mkdir()
    bundles: dict[str, Path] = {}
    for name, settings in SETTINGS.items():
        args = [str(venv / "bin/otelprof"), "mixin", "-o", name,
                *(a for s in settings for a in ("--set", s))]
        result = _run(args, cwd=cwd, env=_env())
        assert not result.stderr
        bundles[name] = cwd / name
        _check_bundle(bundles[name], with_overrides(MixinConfig(), settings), tmp_path)
        rules = yaml.safe_load((bundles[name] / "otelprof-rules.yaml").read_text())
        recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
        assert _records_read(bundles[name]) <= recorded, (name, _records_read(bundles[name]) - recorded)
    assert (bundles["default"] / "otelprof-rules.yaml").read_text() != \
        (bundles["window-5m"] / "otelprof-rules.yaml").read_text()

    port = free_port()
    env = {**os.environ, "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
           "OTEL_EXPORTER_PROMETHEUS_PORT": str(port), "OTELPROF_SAMPLE_INTERVAL_MS": "200",
           "OTEL_TRACES_EXPORTER": "none", "PYTHONPATH": str(ROOT)}
    with contextlib.ExitStack() as stack:
        # one Prometheus per bundle, each with that bundle's rules only, all scraping the same run
        proms = {}
        for name, bundle in bundles.items():
            (tmp_path / name).mkdir()
            proms[name] = stack.enter_context(prometheus(
                tmp_path / name, [f"127.0.0.1:{port}"], scrape_interval=f"{int(SCRAPE)}s",
                rule_files=[bundle / "otelprof-rules.yaml"]))
        # the training run needs torch: it runs in this environment; the bundle under test is the wheel's
        demo = subprocess.run([sys.executable, "-c", DEMO, str(DURATION), str(tmp_path / "runs")], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=DURATION + 60)
        assert demo.returncode == 0, demo.stderr
        start, end = _run_window(proms["default"])
        range_s = int(end - start) + 1
        time.sleep(SCRAPE)
        results = {name: _query_all(proms[name], _targets(bundle), start, end, range_s)
                   for name, bundle in bundles.items()}
    for name, (_, errors) in results.items():
        assert not errors, f"{name}:\n" + "\n".join(errors)
    default, _ = results["default"]
    assert len(default) > 80, len(default)
    for name, (with_data, _) in results.items():
        assert with_data == default, f"{name}: empty {sorted(default - with_data)}, extra {sorted(with_data - default)}"
