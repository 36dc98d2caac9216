"""Custom rules over saved tensors: ``otelprof check RUN --rules my_rules.py``.

A rules file defines subclasses of :class:`Rule` and/or functions named ``rule_*``; each is invoked once
per saved step of each rank with the rank's :class:`otelprof.recording.tensors.Trial` and the step, and
returns (or yields) the subjects it fires on — tensor or layer names, or ``True`` for "the step". A rule
fires when it names something at any saved step; it is reported beside the built-in checks with the same
columns, JSON and exit codes (docs/tensors.md).

A rule can change the outcome only through its verdicts: anything the file raises while it loads or a rule
raises while it runs (``SystemExit``, ``KeyboardInterrupt`` and other ``BaseException`` subclasses included) is
a one-line :class:`RuleError` naming the rule, and what rules print to ``sys.stdout``/``sys.stderr`` is kept
in a bounded buffer (:class:`Captured`), never reaching ``check --json``'s stdout.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from otelprof.analysis.rule_row import RuleRow
from otelprof.recording.ranks import Recording
from otelprof.recording.tensors import Trial, read_trial

SEVERITIES = ("info", "warning", "critical")


class RuleError(Exception):
    """A rules file that cannot be loaded, or a rule that failed (one line)."""


class Captured:
    """A text sink keeping the first ``limit`` characters written to it (and counting the rest)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self.text = ""
        self.total = 0

    def write(self, text: Any) -> int:
        text = str(text)
        self.total += len(text)
        if len(self.text) < self.limit:
            self.text += text[:self.limit - len(self.text)]
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def _contained(sink: Captured) -> Iterator[None]:
    """Rules' prints go to ``sink``; sys.stdout and sys.stderr are restored afterwards whatever the rule did."""
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = sink  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _describe(exc: BaseException) -> str:
    """``Type: message`` of anything raised, even an exception whose ``str`` raises."""
    try:
        message = str(exc)
    except BaseException:  # a hostile __str__
        message = "<unprintable>"
    if isinstance(exc, SystemExit):
        return f"SystemExit({message or 'None'}) (a rule cannot end check)"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class Rule:
    """Base class of a custom rule: override :meth:`invoke_at_step`; set ``severity`` and ``todo``; the
    class docstring's first line is its description."""

    severity: ClassVar[str] = "warning"
    todo: ClassVar[str] = ""

    def invoke_at_step(self, trial: Trial, step: int) -> Iterable[str] | bool | None:
        raise NotImplementedError


def load(path: str | Path,
         sink: Captured | None = None) -> list[tuple[str, str, str, str, Callable[[Trial, int], Any]]]:
    """(name, severity, description, todo, function) of each rule in the file; what loading prints goes to
    ``sink`` (a fresh buffer without one)."""
    with _contained(sink or Captured()):
        return _load(path)


def _load(path: str | Path) -> list[tuple[str, str, str, str, Callable[[Trial, int], Any]]]:
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
    except BaseException as exc:  # SystemExit and the like too: a rules file cannot end check
        raise RuleError(f"{file}: {_describe(exc)}") from None
    rules: list[tuple[str, str, str, str, Callable[[Trial, int], Any]]] = []
    for name, obj in list(vars(module).items()):
        try:
            if (inspect.isclass(obj) and issubclass(obj, Rule) and obj is not Rule
                    and obj.__module__ == module.__name__):
                rules.append((name, str(obj.severity), _doc(obj), str(obj.todo), obj().invoke_at_step))
            elif inspect.isfunction(obj) and name.startswith("rule_") and obj.__module__ == module.__name__:
                rules.append((name, str(getattr(obj, "severity", "warning")), _doc(obj),
                              str(getattr(obj, "todo", "")), obj))
        except BaseException as exc:  # e.g. a constructor raising SystemExit
            raise RuleError(f"{file}: rule {name} could not be set up: {_describe(exc)}") from None
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


def evaluate(recording: Recording, path: str | Path, sink: Captured | None = None) -> list[RuleRow]:
    """Run every rule of the file over every saved step of every rank; what the rules print goes to ``sink``."""
    sink = sink or Captured()
    rules = load(path, sink)
    trials = [(rank.rank, read_trial(rank.path)) for rank in recording.ranks]
    rows = []
    for name, severity, description, todo, fn in rules:
        evaluations = firing = 0
        subjects: set[str] = set()
        for rank, trial in trials:
            for step in trial.steps():
                evaluations += 1
                try:
                    with _contained(sink):
                        found = _subjects(fn(trial, step))
                except BaseException as exc:  # SystemExit too: only verdicts change the outcome
                    raise RuleError(f"rule {name} failed at step {step} of rank {rank}: {_describe(exc)}") from None
                if found:
                    firing += 1
                    subjects.update(f"rank {rank} {s}" for s in found)
        rows.append(RuleRow(name, "", severity, description, todo, bool(subjects), firing, evaluations,
                            evaluations, None, None, tuple(sorted(subjects)), (("file", str(path)),)))
    return rows
