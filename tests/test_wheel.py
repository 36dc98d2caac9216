"""The wheel: built from this checkout, it is tagged for this interpreter and platform, carries the C
extension and the Python hooks beside it and the PEP 561 marker, requires only what the package imports, and
`otelprof doctor` run from it names the hook path -- C, or Python and why when the extension is gone or turned off."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

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
