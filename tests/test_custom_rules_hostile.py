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
from pathlib import Path

import pytest

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
    ("exit-in-class-rule", "from otelprof.analysis.custom_rules import Rule\nclass Quit(Rule):\n"
     "    def invoke_at_step(self, trial, step):\n        raise SystemExit(0)\n", ["rule Quit", "SystemExit"]),
    ("exit-in-generator", "def rule_gen(trial, step):\n    yield 'x'\n    raise SystemExit(0)\n",
     ["rule rule_gen", "SystemExit"]),
    ("exit-in-constructor", "from otelprof.analysis.custom_rules import Rule\nclass Ctor(Rule):\n"
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
