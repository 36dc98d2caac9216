"""``otelprof check --rules``: a hostile rules file can change the outcome only through its verdicts.

Real rules files under ``tmp_path`` and real ``check`` subprocesses on a recording where a built-in check fires
(exit 1 without rules): anything a rules file raises at load or a rule raises at a step (``SystemExit(0)`` and
other ``BaseException`` subclasses included) is one escaped line naming the rule with exit 2, and what rules print
never reaches ``--json``'s stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from otelprof.config import Config, rule_timeout
from tests.test_tensors import _env, run_job


@pytest.fixture(scope="module")
def sick(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of a recording where a built-in check fires."""
    rank, _ = run_job(tmp_path_factory.mktemp("hostile"), "dead_relu")
    return rank.parent


def _check(run: Path, rules: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otelprof", "check", str(run), *options, "--rules", str(rules)],
                          env=_env(run), capture_output=True, text=True, timeout=300)


def test_the_recording_fires_a_built_in_check(sick: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(sick), "--json"], env=_env(sick),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["checks"]


BOOM = "class Boom(BaseException):\n    pass\n"
HOSTILE = [
    ("exit-at-load", "raise SystemExit(0)\n", ["SystemExit"]),
    ("sys-exit-at-load", "import sys\nprint('bye')\nsys.exit(0)\ndef rule_x(trial, step):\n    return None\n",
     ["SystemExit"]),
    ("exit-in-rule", "def rule_quit(trial, step):\n    raise SystemExit(0)\n", ["rule rule_quit", "SystemExit"]),
    ("exit-in-class-rule", "from otelprof.analysis.check_rules import Rule\nclass Quit(Rule):\n"
     "    def invoke_at_step(self, trial, step):\n        raise SystemExit(0)\n", ["rule Quit", "SystemExit"]),
    ("exit-in-generator", "def rule_gen(trial, step):\n    yield 'x'\n    raise SystemExit(0)\n",
     ["rule rule_gen", "SystemExit"]),
    ("exit-in-constructor", "from otelprof.analysis.check_rules import Rule\nclass Ctor(Rule):\n"
     "    def __init__(self):\n        raise SystemExit(0)\n", ["rule Ctor", "SystemExit"]),
    ("base-exception-at-load", BOOM + "raise Boom('at\\nload')\n", ["Boom"]),
    ("base-exception-in-rule", BOOM + "def rule_boom(trial, step):\n    print('noise')\n    raise Boom('a\\nb')\n",
     ["rule rule_boom", "Boom"]),
    ("keyboard-interrupt-in-rule", "def rule_ki(trial, step):\n    raise KeyboardInterrupt\n",
     ["rule rule_ki", "KeyboardInterrupt"]),
    ("syntax-error", "def rule_x(:\n    return True\n", ["SyntaxError"]),
]


@pytest.mark.parametrize(("content", "expected"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_anything_a_rule_raises_is_one_line_with_exit_2(sick: Path, tmp_path: Path, content: str,
                                                         expected: list[str]) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text(content, encoding="utf-8")
    for options in ((), ("--json",)):
        result = _check(sick, rules, *options)
        assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("otelprof check: --rules: ")
        for text in expected:
            assert text in result.stderr, result.stderr


def test_a_rule_that_prints_leaves_the_json_parseable(sick: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text("import sys\nprint('MARK-load')\n"
                     "def rule_chatty(trial, step):\n    print('MARK-step', step)\n"
                     "    sys.stdout.write('MARK-{not json')\n"
                     "    print('MARK-stderr', file=sys.stderr)\n    return step == 0\n", encoding="utf-8")
    result = _check(sick, rules, "--json")
    assert result.returncode == 1, result.stderr  # the built-in check still fires, and so does the rule
    checks = {c["alert"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["rule_chatty"]["status"] == "fired"
    assert "MARK-" not in result.stdout
    assert "printed" in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------- the time limit

def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting for its parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _gone(pids: list[int]) -> bool:
    """Whether every process of ``pids`` has ended (SIGKILL takes a moment to land on a sleeping process)."""
    for _ in range(200):
        if not any(_running(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _pids(directory: Path) -> list[int]:
    return [int(p.name) for p in directory.iterdir()]


@pytest.fixture(scope="module")
def built_in(sick: Path) -> dict[str, Any]:
    """The built-in checks' verdicts without rules."""
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(sick), "--json"], env=_env(sick),
                            capture_output=True, text=True, timeout=300)
    return {c["alert"]: c for c in json.loads(result.stdout)["checks"]}


MARK = "import os, pathlib\ndef mark():\n    (pathlib.Path(os.environ['PIDS']) / str(os.getpid())).touch()\n"
"""Each process of a rule names itself in $PIDS, for the test to see that none is left."""
FORK = MARK + "def grandchild():\n    if os.fork() == 0:\n        mark()\n        while True:\n            pass\n"
HANGING = [
    ("loops", MARK + "def rule_spin(trial, step):\n    mark()\n    while True:\n        pass\n", "rule rule_spin"),
    ("sleeps", MARK + "import time\ndef rule_nap(trial, step):\n    mark()\n    time.sleep(3600)\n", "rule rule_nap"),
    ("ignores-sigterm", MARK + "import signal, time\ndef rule_stubborn(trial, step):\n    mark()\n"
     "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
     "    while True:\n        time.sleep(0.01)\n", "rule rule_stubborn"),
    ("forks-then-sleeps", FORK + "import time\ndef rule_both(trial, step):\n    mark()\n    grandchild()\n"
     "    time.sleep(3600)\n", "rule rule_both"),
    ("daemonizes-then-sleeps", MARK + "import time\ndef rule_daemon(trial, step):\n    mark()\n"
     "    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n            mark()\n"
     "            time.sleep(3600)\n        os._exit(0)\n    time.sleep(3600)\n", "rule rule_daemon"),
    ("class-rule-loops", MARK + "from otelprof.analysis.check_rules import Rule\nclass Spin(Rule):\n"
     "    def invoke_at_step(self, trial, step):\n        mark()\n        while True:\n            pass\n",
     "rule Spin"),
    ("generator-loops", MARK + "def rule_gen(trial, step):\n    mark()\n    yield 'x'\n    while True:\n"
     "        pass\n", "rule rule_gen"),
    ("two-rules-sleep", MARK + "import time\ndef rule_a(trial, step):\n    mark()\n    time.sleep(3600)\n"
     "def rule_b(trial, step):\n    mark()\n    time.sleep(3600)\n", "rules rule_a, rule_b timed out"),
    ("loads-forever", MARK + "mark()\nwhile True:\n    pass\ndef rule_x(trial, step):\n    return None\n",
     "did not load"),
]


@pytest.mark.parametrize(("content", "expected"), [h[1:] for h in HANGING], ids=[h[0] for h in HANGING])
def test_a_rule_past_the_time_limit_is_one_line_with_exit_2_and_the_checks_intact(
        sick: Path, built_in: dict[str, Any], tmp_path: Path, content: str, expected: str) -> None:
    rules, pids = tmp_path / "rules.py", tmp_path / "pids"
    rules.write_text(content, encoding="utf-8")
    pids.mkdir()
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(sick), "--json", "--rules", str(rules),
                             "--rule-timeout", "1"], env={**_env(sick), "PIDS": str(pids)}, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("otelprof check: --rules: ") and expected in result.stderr, result.stderr
    assert "time limit of 1 s" in result.stderr and "--rule-timeout" in result.stderr, result.stderr
    checks = {c["alert"]: c for c in json.loads(result.stdout)["checks"]}  # one JSON document, the checks intact
    assert checks == built_in
    assert _pids(pids) and _gone(_pids(pids))  # the rule ran, and nothing it started is left


def test_the_other_rules_of_the_file_keep_their_verdicts(sick: Path, built_in: dict[str, Any], tmp_path: Path) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text("import time\ndef rule_first(trial, step):\n    return step == 0\n"
                     "def rule_stuck(trial, step):\n    time.sleep(3600)\n"
                     "def rule_last(trial, step):\n    print('MARK-last')\n    return ['x']\n", encoding="utf-8")
    for options in (("--json",), ()):
        result = _check(sick, rules, *options, "--rule-timeout", "1")
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 2 and "printed" in lines[0] and "MARK-last" in lines[0], lines
        assert lines[1].startswith("otelprof check: --rules: rule rule_stuck timed out"), lines
    checks = {c["alert"]: c for c in json.loads(_check(sick, rules, "--json", "--rule-timeout", "1").stdout)["checks"]}
    assert {k: v for k, v in checks.items() if k in built_in} == built_in
    assert checks["rule_first"]["status"] == "fired" and checks["rule_first"]["firing_evaluations"] == 1
    assert checks["rule_last"]["status"] == "fired"
    assert "rule_stuck" not in checks  # left out; named on stderr
    assert "FIRED" in result.stdout and "rule_last" in result.stdout  # the table too, without --json


ENDING = [
    ("os-exit", MARK + "def rule_bye(trial, step):\n    mark()\n    os._exit(0)\n",
     "rule rule_bye ended the process running the rules (os._exit(0) or a crash)"),
    ("kills-itself", MARK + "import signal\ndef rule_die(trial, step):\n    mark()\n"
     "    os.kill(os.getpid(), signal.SIGKILL)\n",
     "rule rule_die ended the process running the rules (killed by signal 9)"),
    ("os-exit-with-a-grandchild", FORK + "def rule_bye(trial, step):\n    mark()\n    grandchild()\n    os._exit(3)\n",
     "rule rule_bye ended the process running the rules (os._exit(3) or a crash)"),
    ("exit-at-load", MARK + "mark()\nos._exit(0)\n", "while loading ended the process running the rules"),
    ("forks-a-grandchild-that-keeps-running", FORK + "def rule_fork(trial, step):\n    mark()\n    grandchild()\n",
     "rule rule_fork left a process running"),
    ("its-grandchild-leaves-the-group", MARK + "def rule_daemon(trial, step):\n    mark()\n    if os.fork() == 0:\n"
     "        os.setsid()\n        if os.fork() == 0:\n            mark()\n            while True:\n"
     "                pass\n        os._exit(0)\n", "rule rule_daemon left a process running"),
]


@pytest.mark.parametrize(("content", "expected"), [h[1:] for h in ENDING], ids=[h[0] for h in ENDING])
def test_a_rule_that_ends_its_process_or_leaves_one_running_is_one_line_with_exit_2(
        sick: Path, tmp_path: Path, content: str, expected: str) -> None:
    rules, pids = tmp_path / "rules.py", tmp_path / "pids"
    rules.write_text(content, encoding="utf-8")
    pids.mkdir()
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(sick), "--json", "--rules", str(rules)],
                            env={**_env(sick), "PIDS": str(pids)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("otelprof check: --rules: ") and expected in result.stderr, result.stderr
    assert _pids(pids) and _gone(_pids(pids))


def test_a_rule_cannot_write_on_checks_output_through_the_file_descriptors(sick: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text("import os, sys\ndef rule_raw(trial, step):\n    os.write(1, b'MARK-fd1{')\n"
                     "    os.write(2, b'MARK-fd2\\n')\n    sys.__stdout__.write('MARK-dunder')\n"
                     "    sys.__stdout__.flush()\n    return None\n", encoding="utf-8")
    result = _check(sick, rules, "--json")
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["checks"] and "MARK-" not in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------- the setting

NAP = "import time\ndef rule_nap(trial, step):\n    time.sleep(3600)\n"


def test_the_argument_wins_over_the_variable(sick: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text(NAP, encoding="utf-8")
    for env, options, limit in (({"OTELPROF_RULE_TIMEOUT_SECONDS": "1.5"}, (), "1.5 s"),
                                ({"OTELPROF_RULE_TIMEOUT_SECONDS": "3600"}, ("--rule-timeout", "1"), "1 s")):
        result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(sick), "--rules", str(rules),
                                 *options], env={**_env(sick), **env}, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and f"time limit of {limit} (" in result.stderr, result.stderr


def test_the_default_limit_is_10_s() -> None:
    assert rule_timeout(None, {}) == 10.0
    assert rule_timeout(None, {"OTELPROF_RULE_TIMEOUT_SECONDS": " "}) == 10.0
    assert rule_timeout(None, {"OTELPROF_RULE_TIMEOUT_SECONDS": "2.5"}) == 2.5
    assert rule_timeout("7", {"OTELPROF_RULE_TIMEOUT_SECONDS": "2.5"}) == 7.0
    assert Config.from_env({}).rule_timeout == 10.0


@pytest.mark.parametrize("bad", ["x", "0", "-1", "nan", "inf", "1e9", "", "0.01"])
def test_an_invalid_limit_is_one_line_with_exit_2(sick: Path, tmp_path: Path, bad: str) -> None:
    rules = tmp_path / "rules.py"
    rules.write_text(NAP, encoding="utf-8")
    for env, options, name in (({}, ("--rule-timeout", bad), "--rule-timeout"),
                               ({"OTELPROF_RULE_TIMEOUT_SECONDS": bad}, (), "OTELPROF_RULE_TIMEOUT_SECONDS")):
        if not bad and not options:
            continue  # an empty variable is unset
        result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(sick), "--rules", str(rules),
                                 *options], env={**_env(sick), **env}, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr
        assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert name in result.stderr, result.stderr


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_where_the_platform_cannot_fork_the_rules_process_reads_the_tensors_again(
        sick: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    """In this process (the rules' process must never come back into its caller), with each start method: the
    verdicts, what the rules printed, and the rule past the limit left out."""
    import multiprocessing

    from otelprof.analysis import check_rules
    from otelprof.analysis.report import load

    monkeypatch.setattr(check_rules, "_context", lambda: multiprocessing.get_context(start))
    rules = tmp_path / "rules.py"
    rules.write_text("import time\ndef rule_first(trial, step):\n    print('MARK')\n    return step == 0\n"
                     "def rule_nap(trial, step):\n    time.sleep(3600)\n"
                     "def rule_names(trial, step):\n"
                     "    return sorted(trial.tensor_names(collection='gradients'))[:1]\n",
                     encoding="utf-8")
    sink = check_rules.Captured()
    with pytest.raises(check_rules.RuleTimeout, match="rule rule_nap timed out") as timed_out:
        check_rules.evaluate(load(str(sick), None, None), rules, sink, 1.0)
    rows = {row.alert: row for row in timed_out.value.rows}
    assert list(rows) == ["rule_first", "rule_names"]
    assert rows["rule_first"].subjects == ("rank 0 step",) and rows["rule_first"].firing_evaluations == 1
    assert rows["rule_names"].subjects == ("rank 0 gradients/0.bias",)
    assert sink.text.startswith("MARK\n") and sink.total == 5 * rows["rule_first"].evaluations
