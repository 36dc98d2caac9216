"""Check rules in Python over saved tensors: ``otelprof check RUN --rules my_rules.py`` (not the mixin's custom
live rules, which are PromQL).

A rules file defines subclasses of :class:`Rule` and/or functions named ``rule_*``; each is invoked once
per saved step of each rank with the rank's :class:`otelprof.recording.tensors.Trial` and the step, and
returns (or yields) the subjects it fires on — tensor or layer names, or ``True`` for "the step". A rule
fires when it names something at any saved step; it is reported beside the built-in checks with the same
columns, JSON and exit codes (docs/tensors.md).

A rule can change the outcome only through its verdicts: anything the file raises while it loads or a rule
raises while it runs (``SystemExit``, ``KeyboardInterrupt`` and other ``BaseException`` subclasses included) is
a one-line :class:`RuleError` naming the rule, and what rules print to ``sys.stdout``/``sys.stderr`` is kept
in a bounded buffer (:class:`Captured`), never reaching ``check --json``'s stdout.

:func:`evaluate` runs the rules in a process of their own (:func:`_child`), which sends the verdicts back as
JSON: a rule that runs past the time limit (``--rule-timeout``, ``OTELPROF_RULE_TIMEOUT_SECONDS``) is killed
with every process it started and reported as :class:`RuleTimeout`; one that ends that process or leaves a
process running is a :class:`RuleError` too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import signal
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
    """Base class of a check rule: override :meth:`invoke_at_step`; set ``severity`` and ``todo``; the
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
        raise RuleError(f"{file} defines no rule (a subclass of otelprof.analysis.check_rules.Rule or a function "
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


# ---------------------------------------------------------------------------------------------- the rules' process

DEFAULT_TIMEOUT = 10.0
"""Seconds each rule (and the loading of the file) may take in all, by default (``--rule-timeout``,
``OTELPROF_RULE_TIMEOUT_SECONDS``)."""
MAX_MESSAGE = 64 * 2**20
"""Bytes of one verdict sent back by the rules' process at most."""
_LIMIT_NAMES = "--rule-timeout, OTELPROF_RULE_TIMEOUT_SECONDS"
_SETUP = 60.0
"""Seconds the rules' process may take to start before it loads the file (where it cannot fork: start Python and
read the tensors again)."""
_GRACE = 1.0
"""Seconds past the limit before check kills the rules' process group itself."""


class RuleTimeout(RuleError):
    """Rules (or the loading of their file) that passed the time limit; ``rows`` are the verdicts of the file's
    other rules."""

    def __init__(self, message: str, rows: list[RuleRow]) -> None:
        super().__init__(message)
        self.rows = rows


def evaluate(recording: Recording, path: str | Path, sink: Captured | None = None,
             timeout: float = DEFAULT_TIMEOUT) -> list[RuleRow]:
    """Run every rule of the file over every saved step of every rank; what the rules print goes to ``sink``.

    The rules run in a process of their own (forked where the platform can, so they read the trials already
    read here), in a process group that is SIGKILLed once they are done or a rule has run for ``timeout``
    seconds; it sends back plain data (JSON), never objects. A rule that times out is left out and the others
    run in a new process: :class:`RuleTimeout` then carries their rows. Anything else a rule does wrong (raise,
    ``os._exit``, leave a process running) is a :class:`RuleError`."""
    sink = sink or Captured()
    trials = [(rank.rank, read_trial(rank.path)) for rank in recording.ranks]
    rows: dict[str, RuleRow] = {}
    order: list[str] = []
    timed_out: list[str] = []
    loaded = True
    while True:
        outcome = _run_process(Path(path), trials, set(rows) | set(timed_out), timeout, sink)
        order = outcome.order or order
        rows.update(outcome.rows)
        if outcome.timed_out == "":  # loading the file took too long: no (further) rule ran
            loaded = False
        if not outcome.timed_out or outcome.timed_out in timed_out:  # (a skipped rule cannot time out again)
            break
        timed_out.append(outcome.timed_out)
    ordered = [rows[name] for name in order if name in rows]
    problems = [] if loaded else [f"{path} did not load within the time limit of {timeout:g} s"]
    if timed_out:
        problems.append(f"rule{'s' if len(timed_out) > 1 else ''} {', '.join(timed_out)} timed out: no verdict "
                        f"within the time limit of {timeout:g} s")
    if problems:
        raise RuleTimeout(f"{'; '.join(problems)} ({_LIMIT_NAMES}); left out of the checks", ordered)
    return ordered


def _evaluate_rule(name: str, severity: str, description: str, todo: str, fn: Callable[[Trial, int], Any],
                   trials: list[tuple[int, Trial]], path: str | Path, sink: Captured) -> RuleRow:
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
    return RuleRow(name, "", severity, description, todo, bool(subjects), firing, evaluations, evaluations, None,
                   None, tuple(sorted(subjects)), (("file", str(path)),))


class _Outcome:
    """What one rules' process sent back: the rules' order, the rows it finished, the rule it timed out in
    (``""``: while loading; None: it did not time out)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.rows: dict[str, RuleRow] = {}
        self.timed_out: str | None = None
        self.shown = self.printed = 0
        """Characters the process printed that were brought to the sink, and printed in all."""


def _context() -> Any:
    import multiprocessing

    return multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def _run_process(path: Path, trials: list[tuple[int, Trial]], skip: set[str], timeout: float,
                 sink: Captured) -> _Outcome:
    import time
    import warnings
    from multiprocessing.connection import wait

    context = _context()
    reader, writer = context.Pipe(duplex=False)
    forked = context.get_start_method() == "fork"
    source: Any = trials if forked else [(rank, str(trial.path)) for rank, trial in trials]
    process = context.Process(target=_child, args=(str(path), source, sorted(skip), timeout, writer), daemon=False)
    outcome = _Outcome()
    ended: int | None = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "fork() in a multi-threaded process": the child only runs rules
            process.start()
        writer.close()
        if hasattr(os, "setpgid"):  # also set by the child: whichever runs first, it is its own group at once
            with contextlib.suppress(OSError):
                os.setpgid(process.pid, process.pid)
        running = ""  # the rule running now ("": loading)
        deadline = time.monotonic() + timeout + _SETUP  # until the process says it starts loading the file
        ended = _exit_handle(process.pid)
        while True:
            left = deadline + _GRACE - time.monotonic()  # the process's own clock acts first (_Watch)
            if left <= 0:
                outcome.timed_out = running
                return outcome
            # Not the process's sentinel: a process a rule forked holds it open, as it holds the pipe.
            ready = wait([reader] if ended is None else [reader, ended], left if ended is not None else min(left, 0.05))
            if reader in ready:
                message = _receive(reader)
                if message is not None:
                    if message.get("kind") == "timeout":
                        outcome.timed_out = running
                        process.join(_GRACE)  # it ends itself once what the rules started is gone
                        return outcome
                    if _take(message, outcome, sink):
                        return outcome
                    if message.get("kind") in ("load", "start"):
                        running, deadline = str(message.get("rule", "")), time.monotonic() + timeout
                    continue
                process.join(0.5)  # the pipe closed, or what came is not a verdict
                if process.is_alive():
                    raise RuleError(f"the rules' process of {path} sent back something that is not a verdict")
            elif process.exitcode is None or reader.poll(0):  # still running, or read what it sent before it ended
                continue
            _kill(process)
            what = f"rule {running}" if running else f"{path} while loading"
            raise RuleError(f"{what} ended the process running the rules ({_exit_status(process.exitcode)}); "
                            "a rule cannot end check")
    finally:
        _kill(process)
        reader.close()
        if ended is not None:
            os.close(ended)


def _exit_handle(pid: int | None) -> int | None:
    """A file descriptor that becomes readable when process ``pid`` ends (Linux), else None (polled instead)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or pid is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def _receive(reader: Any) -> dict[str, Any] | None:
    """The next message of the rules' process; None when the pipe closed or what came is not a message."""
    try:
        data = reader.recv_bytes(MAX_MESSAGE)
    except (EOFError, OSError):  # ended, or sent more than a verdict's worth
        return None
    try:
        message = json.loads(data)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _take(message: dict[str, Any], outcome: _Outcome, sink: Captured) -> bool:
    """Keep what a message says; whether the process is done."""
    kind = message.get("kind")
    _printed(message, outcome, sink)
    if kind == "loaded":
        outcome.order = [str(n) for n in message.get("rules", ())]
    elif kind == "row":
        row = _row(message)
        outcome.rows[row.alert] = row
    elif kind == "error":
        raise RuleError(str(message.get("error", "")))
    return kind == "done"


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {-code}"
    return f"os._exit({code}) or a crash"


def _kill(process: Any) -> None:
    """SIGKILL the rules' process group (what rules started too), then reap the process."""
    if process.pid is None:
        return
    if hasattr(os, "killpg"):
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)  # before the join: the group's id cannot be reused yet
    with contextlib.suppress(OSError, ValueError):
        process.kill()
    with contextlib.suppress(OSError, ValueError, AssertionError):
        process.join()


def _printed(message: dict[str, Any], outcome: _Outcome, sink: Captured) -> None:
    """Bring what the rules printed since the last message (the process keeps its first ``limit`` characters and
    counts the rest) to ``sink``."""
    text, total = message.get("printed"), message.get("total")
    if isinstance(text, str) and type(total) is int and total > outcome.printed:
        new = text[outcome.shown:]
        sink.write(new)
        sink.total += total - outcome.printed - len(new)
        outcome.shown, outcome.printed = len(text), total


def _row(message: dict[str, Any]) -> RuleRow:
    row = message.get("row")
    try:
        assert isinstance(row, dict)
        name, severity, description, todo = (row[k] for k in ("alert", "severity", "description", "todo"))
        firing, evaluations, subjects = row["firing"], row["evaluations"], row["subjects"]
        assert all(isinstance(s, str) for s in (name, severity, description, todo, *subjects))
        assert type(firing) is int and type(evaluations) is int and isinstance(subjects, list)
        assert severity in SEVERITIES
    except (AssertionError, KeyError, TypeError, ValueError):
        raise RuleError("the rules' process sent back something that is not a verdict") from None
    return RuleRow(name, "", severity, description, todo, bool(subjects), firing, evaluations, evaluations, None,
                   None, tuple(subjects), tuple((str(k), str(v)) for k, v in row.get("parameters", ())))


def _child(path: str, source: list[tuple[int, Any]], skip: list[str], timeout: float, writer: Any) -> None:
    """The rules' process: load the file, run its rules but ``skip``, send each verdict back as JSON."""
    import threading

    pid = os.getpid()
    sink = Captured()
    lock = threading.Lock()

    def send(kind: str, **fields: Any) -> None:
        if os.getpid() != pid:  # a process a rule forked came back here: it has nothing to say
            os._exit(0)
        with lock:
            writer.send_bytes(json.dumps({"kind": kind, "printed": sink.text, "total": sink.total,
                                          **fields}).encode())

    watch = _Watch(timeout, lambda: send("timeout"))
    try:
        _isolate()
        watch.start()
        trials = [(rank, t if isinstance(t, Trial) else read_trial(t)) for rank, t in source]
        watch.arm()  # the limit is the rules': not the start of this process nor its reading of the tensors
        send("load")
        rules = load(path, sink)
        _left_running(f"{path}")
        send("loaded", rules=[r[0] for r in rules])
        for name, severity, description, todo, fn in rules:
            if name in skip:
                continue
            watch.arm()
            send("start", rule=name)
            row = _evaluate_rule(name, severity, description, todo, fn, trials, path, sink)
            _left_running(f"rule {name}")
            send("row", row={"alert": row.alert, "severity": row.severity, "description": row.description,
                             "todo": row.recommendation, "firing": row.firing_evaluations,
                             "evaluations": row.evaluations, "subjects": list(row.subjects),
                             "parameters": [list(p) for p in row.parameters]})
        watch.disarm()
        send("done")
    except RuleError as exc:
        watch.disarm()
        send("error", error=str(exc))
    except BaseException as exc:  # whatever a rule left behind (a hostile __str__, a closed pipe)
        watch.disarm()
        with contextlib.suppress(BaseException):
            send("error", error=f"the rules of {path} could not run: {_describe(exc)}")


class _Watch:
    """The rules' process's own clock: when the running rule (or the loading) passes the limit, it kills every
    process the rules started, even those that left the group (which check's SIGKILL of the group, its backstop
    for a rule that keeps this thread from running, would miss), says so and ends the process."""

    def __init__(self, timeout: float, say: Callable[[], None]) -> None:
        import time

        self.timeout, self.say, self.clock = timeout, say, time.monotonic
        self.deadline = float("inf")

    def start(self) -> None:
        import threading

        threading.Thread(target=self._run, name="otelprof-rule-timeout", daemon=True).start()

    def arm(self) -> None:
        self.deadline = self.clock() + self.timeout

    def disarm(self) -> None:
        self.deadline = float("inf")

    def _run(self) -> None:
        import time

        while self.clock() < self.deadline:
            time.sleep(0.02)
        with contextlib.suppress(BaseException):
            _kill_children()
            self.say()
        os._exit(0)


def _isolate() -> None:
    """Own process group (killed as one, Ctrl-C stays with check); file descriptors 1 and 2 on the null device
    (even ``os.write(1, ...)`` and C extensions stay off ``check``'s output); on Linux the reaper of what rules
    leave behind (found by :func:`_left_running`)."""
    if hasattr(os, "setsid"):
        try:
            os.setsid()
        except OSError:  # check made it a group leader first
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(null, fd)
    os.close(null)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _left_running(what: str) -> None:
    """A rule that leaves a process running fails: it is killed here (on Linux, even one that left the group)."""
    if not hasattr(os, "waitpid") or not hasattr(os, "WNOHANG") or not _children_alive():
        return
    _kill_children()
    raise RuleError(f"{what} left a process running (a rule must wait for the processes it starts); it was killed")


def _kill_children() -> None:
    """SIGKILL this process's children and reap them; what they started comes to this process in turn (it is
    their reaper on Linux) and goes the same way."""
    for _ in range(1000):
        pids = _child_pids()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)


def _children_alive() -> bool:
    """Reap the children that ended; whether one is still running."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _child_pids() -> list[int]:
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                pids += [int(p) for p in (task / "children").read_text().split()]
    return pids
