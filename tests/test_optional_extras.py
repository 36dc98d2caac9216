"""The suite collects with the `dev` extra alone: a test module that needs an optional extra is skipped,
naming it (tests/conftest.py); and TESTS_NO_SKIP=1 (the Makefile's test target) fails a session in which
anything skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OPTIONAL_MODULES

ROOT = Path(__file__).resolve().parents[1]

# Installed first on the path: the named top-level modules cannot be imported, as if not installed.
BLOCKER = '''
import os, sys

BLOCKED = set(os.environ["BLOCK_IMPORTS"].split(","))


class _Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
'''


def _pytest(tmp_path: Path, blocked: set[str], *args: str, no_skip: bool = False) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("TESTS_NO_SKIP", "PYTEST_ADDOPTS", "CI")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env["BLOCK_IMPORTS"] = ",".join(sorted(blocked))
    if no_skip:
        env["TESTS_NO_SKIP"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("extras", [
    pytest.param(set(), id="dev-alone"),
    pytest.param({"torch"}, id="torch-and-dev"),
])
def test_the_suite_collects_without_the_optional_extras(tmp_path: Path, extras: set[str]) -> None:
    blocked = {module for module, extra in OPTIONAL_MODULES.items() if extra not in extras}
    done = _pytest(tmp_path, blocked, "--collect-only", "-q", "tests")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "error" not in done.stdout.strip().splitlines()[-1], out[-4000:]  # "N tests collected in S s"
    assert "test_recording_fastjson.py needs the fast extra" in out  # skipped with the extra's name
    # the reader's other tests only share a helper with it: they still collect without orjson
    assert "tests/test_node_lines.py::" in out and "tests/test_sample_packing.py::" in out
    if "torch" in extras:
        assert "tests/test_torch.py::" in out
    else:
        assert "test_torch.py needs the torch extra" in out


def test_no_skip_fails_a_session_in_which_a_test_skipped(tmp_path: Path) -> None:
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n\ndef test_runs() -> None:\n    pass\n\n\n"
        "def test_skips() -> None:\n    pytest.skip('no such device')\n", encoding="utf-8")
    args = ("-q", "-p", "tests.conftest", str(tmp_path / "test_skips.py"))
    allowed = _pytest(tmp_path, set(), *args)
    assert allowed.returncode == 0, allowed.stdout
    refused = _pytest(tmp_path, set(), *args, no_skip=True)
    assert refused.returncode == 1, refused.stdout
    assert "TESTS_NO_SKIP=1: nothing may skip" in refused.stdout
    assert "test_skips.py::test_skips: Skipped: no such device" in refused.stdout


def test_no_skip_fails_a_session_in_which_a_module_skipped_for_want_of_an_extra(tmp_path: Path) -> None:
    args = ("--collect-only", "-q", "tests/test_recording_fastjson.py", "tests/test_node_lines.py")
    assert _pytest(tmp_path, {"orjson"}, *args).returncode == 0
    refused = _pytest(tmp_path, {"orjson"}, *args, no_skip=True)
    assert refused.returncode == 1, refused.stdout
    assert "test_recording_fastjson.py needs the fast extra" in refused.stdout
