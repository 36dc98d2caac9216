"""``import otelprof`` imports no framework integration: the runtime core runs a whole session without any, and an
integration loads when its framework is used (PyTorch's profiler once torch is imported, before ``init()`` or
after it). The core's modules import no integration and no framework at module level."""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof.runtime import extensions, profile_schedule

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "otelprof"
CORE = sorted([*(PACKAGE / "runtime").rglob("*.py"), *(PACKAGE / "recording").rglob("*.py"),
               *(PACKAGE / "shared").rglob("*.py"), PACKAGE / "config.py"])
FRAMEWORKS = ("torch", "jax", "tensorflow", "keras", "numpy", "lightning", "pytorch_lightning", "transformers",
              "accelerate")
"""numpy too: nothing in the core imports it (``record()`` of an array looks for NumPy in ``sys.modules``)."""


def python(source: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``source`` run in a fresh interpreter on this checkout, ``args`` in ``sys.argv[1:]``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def run_python(source: str, cwd: Path, *args: str) -> dict[str, Any]:
    """The JSON that ``source``, run by :func:`python`, prints last (it must exit 0)."""
    proc = python(source, cwd, *args)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_a_session_without_a_framework_loads_no_integration_and_no_framework(tmp_path: Path) -> None:
    found = run_python("""
        import json, sys, time
        import otelprof
        from otelprof.runtime import extensions, profile_schedule

        imported = sorted(m for m in sys.modules if m.startswith("otelprof.integrations"))
        profile_schedule.RETRY = 0.01
        turns = []
        load = extensions.load_deferred
        extensions.load_deferred = lambda: turns.append(1) or load()  # count the schedule's turns
        session = otelprof.init(job_name="plain", record_dir="runs", profile_warmup=0, profile_every=60)
        deadline = time.monotonic() + 60
        step = 0
        while len(turns) < 5 and time.monotonic() < deadline:  # the schedule looked for a profiler a few times
            with otelprof.step():
                with otelprof.annotate("forward"):
                    otelprof.record("loss", 1.0 / (step + 1))
            step += 1
            time.sleep(0.005)
        otelprof.shutdown()
        print(json.dumps({"at_import": imported, "turns": len(turns), "steps": step,
                          "status": json.load(open(session.run_dir / "manifest.json"))["status"],
                          "integrations": sorted(m for m in sys.modules if m.startswith("otelprof.integrations")),
                          "frameworks": [m for m in sys.argv[1:] if m in sys.modules]}))
    """, tmp_path, *FRAMEWORKS)
    assert found["at_import"] == []
    assert found["turns"] >= 5 and found["steps"] > 0 and found["status"] == "finished"
    assert found["integrations"] == []
    assert found["frameworks"] == []


@pytest.mark.parametrize("when", ["before init", "after init"])
def test_torch_imported_before_or_after_init_gets_its_periodic_profiling_windows(tmp_path: Path, when: str) -> None:
    found = run_python("""
        import json, sys, time
        if sys.argv[1] == "before init":
            import torch
        import otelprof
        from otelprof.runtime import extensions, profile_schedule

        profile_schedule.RETRY = 0.05
        session = otelprof.init(record_dir="runs", system_metrics=False, profile_warmup=0, profile_steps=2)
        loaded_at_init = "otelprof.integrations.torch_profiler" in sys.modules
        import torch
        weight = torch.randn(32, 32)
        deadline = time.monotonic() + 120
        while not profile_schedule.of(session).windows_run and time.monotonic() < deadline:
            with otelprof.step():
                (weight @ weight).sum()
            time.sleep(0.005)
        from otelprof.integrations import torch_profiler
        profiler_is_torch = extensions.profiler() is torch_profiler.windows
        run_dir = session.run_dir
        otelprof.shutdown()
        print(json.dumps({"loaded_at_init": loaded_at_init, "profiler_is_torch": profiler_is_torch,
                          "triggers": [json.loads(line)["trigger"] for line in open(run_dir / "profiles.jsonl")]}))
    """, tmp_path, when)
    assert found == {"loaded_at_init": when == "before init", "profiler_is_torch": True,
                     "triggers": ["periodic"]}


def test_torch_loads_its_profiler_as_a_session_starts_only_when_imported(tmp_path: Path) -> None:
    found = run_python("""
        import json, sys
        import torch
        import otelprof

        before = "otelprof.integrations.torch_profiler" in sys.modules
        otelprof.init(record_dir="runs", system_metrics=False, profile_every=0)
        print(json.dumps({"before": before, "after": "otelprof.integrations.torch_profiler" in sys.modules}))
        otelprof.shutdown()
    """, tmp_path)
    assert found == {"before": False, "after": True}


def test_a_profiler_loaded_during_a_session_is_still_stopped_at_exit(tmp_path: Path) -> None:
    """Loaded after ``init()`` (``otelprof run`` imports torch then), PyTorch's profiler joins the running session:
    a window left running on the main thread by a session closed from another thread is stopped at exit, not
    left to crash the interpreter's teardown (exit 139)."""
    proc = python("""
        import json, sys, threading
        import otelprof

        otelprof.init(record_dir="runs", system_metrics=False, profile_every=0)
        import torch
        from otelprof.integrations import torch as otorch  # loads the profiler during the session

        otorch.profile_window(1, 10)
        for _ in range(3):
            with otelprof.step():
                torch.mm(torch.randn(4, 4), torch.randn(4, 4))
        closer = threading.Thread(target=otelprof.shutdown)  # the session ends elsewhere, mid-window
        closer.start()
        closer.join()
        print(json.dumps({"still_running": bool(torch.autograd.profiler._is_profiler_enabled)}))
    """, tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert json.loads(proc.stdout) == {"still_running": True}  # until the interpreter's exit stopped it


# ------------------------------------------------------------------ the seam itself, with stand-ins made here
STANDIN = """
from otelprof.runtime import extensions


class StandIn:
    \"\"\"A profiler of a framework made up here: it records what the schedule asks of it.\"\"\"

    baseline_steps = 2
    close_wait = 1.0
    busy = False

    def __init__(self):
        self.armed, self.resets, self.closed = [], 0, []

    def arm(self, start_step, num_steps, *, top=15, trigger="api", phase=None, on_finished=None):
        self.armed.append((start_step, num_steps, trigger))
        if on_finished is not None:
            on_finished(0.0)
        return {"armed": True}

    def reset(self):
        self.resets += 1

    def close(self, timeout):
        self.closed.append(timeout)


standin = StandIn()
extensions.register_profiler(standin, FRAMEWORK)
"""


@pytest.fixture
def framework(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A made-up framework's module name; its integration ``<name>_integration``, on ``sys.path``, registers a
    stand-in profiler as ``standin``, and ``<name>_broken`` fails to import. The registry holds only what the test
    registers (not PyTorch's profiler, which other tests load) until it ends."""
    name = f"otelprof_test_framework_{os.getpid()}"
    (tmp_path / f"{name}_integration.py").write_text(f"FRAMEWORK = {name!r}\n" + STANDIN)
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('cannot load')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(extensions, "_profilers", [])
    monkeypatch.setattr(extensions, "_deferred", [])
    yield name
    otelprof.shutdown()
    for module in (name, f"{name}_integration", f"{name}_broken"):
        sys.modules.pop(module, None)


def test_a_deferred_integration_loads_once_its_framework_is_imported(framework: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    integration = f"{framework}_integration"
    extensions.load_when_imported(framework, integration)
    extensions.load_when_imported(framework, f"{framework}_broken")
    extensions.load_deferred()
    assert integration not in sys.modules
    sys.modules[framework] = types.ModuleType(framework)  # the job imports the framework
    caplog.set_level(logging.ERROR, logger="otelprof")
    extensions.load_deferred()
    standin = sys.modules[integration].standin
    assert extensions.profiler() is standin and extensions.profilers() == [standin]
    assert [r.getMessage() for r in caplog.records] == [f"otelprof: the integration {framework}_broken did not load"]
    assert (framework, f"{framework}_broken") not in extensions._deferred  # tried once, not at every turn


def test_the_schedule_arms_windows_on_any_registered_profiler_once_its_framework_is_imported(
        framework: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(profile_schedule, "RETRY", 0.01)
    extensions.load_when_imported(framework, f"{framework}_integration")
    session = otelprof.init(record_dir=str(tmp_path / "runs"), system_metrics=False, profile_warmup=0,
                            profile_every=3600, profile_steps=4, profile_warmup_steps=0)
    schedule = profile_schedule.of(session)
    assert schedule is not None and f"{framework}_integration" not in sys.modules
    sys.modules[framework] = types.ModuleType(framework)  # imported after init()
    deadline = time.monotonic() + 60
    while not schedule.windows_run and time.monotonic() < deadline:
        with otelprof.step():
            pass
        time.sleep(0.005)
    standin = sys.modules[f"{framework}_integration"].standin
    otelprof.shutdown()
    [(start, steps, trigger)] = standin.armed
    assert steps == 4 and trigger == "periodic" and start >= standin.baseline_steps
    assert standin.resets == 1  # it joined the running session
    assert len(standin.closed) == 1 and 0.0 <= standin.closed[0] <= standin.close_wait


# ------------------------------------------------------------------ static: the core's module-level imports
def _module_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import that runs as ``path`` is imported: module and class bodies, under ``if``,
    ``try`` and ``with`` there, not inside functions; ``importlib.import_module("...")`` with a literal too."""
    found: list[tuple[int, str]] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if not node.level:  # (the core's relative imports stay inside its own packages)
                    found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
            elif isinstance(node, (ast.ClassDef, ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            else:
                found.extend((call.lineno, call.args[0].value) for call in ast.walk(node)
                             if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant)
                             and isinstance(call.args[0].value, str)
                             and getattr(call.func, "attr", getattr(call.func, "id", None))
                             in ("import_module", "__import__"))

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)
    return found


def test_the_core_imports_no_integration_and_no_framework_at_module_level() -> None:
    forbidden = ("otelprof.integrations", *FRAMEWORKS)
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in CORE
             for line, module in _module_level_imports(path)
             if any(module == f or module.startswith(f + ".") for f in forbidden)]
    assert not wrong, "\n".join(wrong)


def test_the_static_check_sees_each_form_of_module_level_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(textwrap.dedent("""
        import torch.nn
        from otelprof.integrations import torch_profiler
        try:
            import numpy
        except ImportError:
            from jax import numpy as jnp
        if True:
            import keras
        class C:
            import tensorflow
        import importlib
        profiler = importlib.import_module("otelprof.integrations.torch_profiler")
        def later():
            import lightning
    """))
    assert [module for _, module in _module_level_imports(source)] == [
        "torch.nn", "otelprof.integrations.torch_profiler", "numpy", "jax.numpy", "keras", "tensorflow",
        "importlib", "otelprof.integrations.torch_profiler"]
