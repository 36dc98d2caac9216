"""Custom rules over saved tensors: ``otelprof check RUN --rules my_rules.py``.

A rules file defines subclasses of :class:`Rule` and/or functions named ``rule_*``; each is invoked once
per saved step of each rank with the rank's :class:`otelprof.recording.tensors.Trial` and the step, and
returns (or yields) the subjects it fires on — tensor or layer names, or ``True`` for "the step". A rule
fires when it names something at any saved step; it is reported beside the built-in checks with the same
columns, JSON and exit codes (docs/tensors.md).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from otelprof.analysis.rules import RuleRow
from otelprof.recording.ranks import Recording
from otelprof.recording.tensors import Trial, read_trial

SEVERITIES = ("info", "warning", "critical")


class RuleError(Exception):
    """A rules file that cannot be loaded, or a rule that failed (one line)."""


class Rule:
    """Base class of a custom rule: override :meth:`invoke_at_step`; set ``severity`` and ``todo``; the
    class docstring's first line is its description."""

    severity: ClassVar[str] = "warning"
    todo: ClassVar[str] = ""

    def invoke_at_step(self, trial: Trial, step: int) -> Iterable[str] | bool | None:
        raise NotImplementedError


def load(path: str | Path) -> list[tuple[str, str, str, str, Callable[[Trial, int], Any]]]:
    """(name, severity, description, todo, function) of each rule in the file."""
    file = Path(path)
    if not file.is_file():
        raise RuleError(f"{file} is not a file")
    spec = importlib.util.spec_from_file_location(f"otelprof_custom_rules_{abs(hash(str(file)))}", file)
    if spec is None or spec.loader is None:
        raise RuleError(f"{file} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise RuleError(f"{file}: {type(exc).__name__}: {exc}") from None
    rules: list[tuple[str, str, str, str, Callable[[Trial, int], Any]]] = []
    for name, obj in vars(module).items():
        if inspect.isclass(obj) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
            rules.append((name, obj.severity, _doc(obj), obj.todo, obj().invoke_at_step))
        elif inspect.isfunction(obj) and name.startswith("rule_") and obj.__module__ == module.__name__:
            rules.append((name, str(getattr(obj, "severity", "warning")), _doc(obj), str(getattr(obj, "todo", "")),
                          obj))
    if not rules:
        raise RuleError(f"{file} defines no rule (a subclass of otelprof.analysis.custom_rules.Rule or a function "
                        "named rule_*)")
    for name, severity, *_ in rules:
        if severity not in SEVERITIES:
            raise RuleError(f"{file}: rule {name} has severity {severity!r}, not one of {', '.join(SEVERITIES)}")
    return rules


def _doc(obj: Any) -> str:
    return (inspect.getdoc(obj) or "").split("\n\n")[0].replace("\n", " ")


def _subjects(result: Any) -> list[str]:
    if result is None or result is False:
        return []
    if result is True:
        return ["step"]
    if isinstance(result, str):
        return [result]
    return [str(s) for s in result]


def evaluate(recording: Recording, path: str | Path) -> list[RuleRow]:
    """Run every rule of the file over every saved step of every rank."""
    rules = load(path)
    trials = [(rank.rank, read_trial(rank.path)) for rank in recording.ranks]
    rows = []
    for name, severity, description, todo, fn in rules:
        evaluations = firing = 0
        subjects: set[str] = set()
        for rank, trial in trials:
            for step in trial.steps():
                evaluations += 1
                try:
                    found = _subjects(fn(trial, step))
                except Exception as exc:
                    raise RuleError(f"rule {name} failed at step {step} of rank {rank}: "
                                    f"{type(exc).__name__}: {exc}") from None
                if found:
                    firing += 1
                    subjects.update(f"rank {rank} {s}" for s in found)
        rows.append(RuleRow(name, "", severity, description, todo, bool(subjects), firing, evaluations,
                            evaluations, None, None, tuple(sorted(subjects)), (("file", str(path)),)))
    return rows
