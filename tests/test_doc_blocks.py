"""Every fenced code block of README.md and docs/*.md that can run on a CPU machine runs, as the docs say.

The blocks are found by a CommonMark parser (markdown-it-py) and run per document, in document order, by
tests/doc_blocks_driver.py in a fresh directory: python blocks in one namespace (a block sees what the
blocks before it defined; README.md's define everything they use, docs/*.md's fragments get PRELUDE's
`model`, `optimizer` and `loader`, and CONTEXT's objects where a block needs more); shell lines that run
`otelprof` or `python`, against the runs recorded before them (each docs/*.md page starts with one run of
README.md's train.py, the fixture run); yaml and json blocks parsed (whole Prometheus / Alertmanager files
checked with promtool / amtool). A block that cannot run here is in NOT_RUN with the reason, a line of a
block in LINES_NOT_RUN; `text` blocks are illustrations (output, layouts). Any other block fails the test,
and so does an entry of those tables that no longer matches.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from otelprof import environment_variables as ev
from otelprof.recording.reader import read_recording
from tests.doc_blocks_driver import check_yaml
from tests.servers import require_binary

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DRIVER = Path(__file__).with_name("doc_blocks_driver.py")

ILLUSTRATIONS = {"text"}  # info strings of blocks not meant to run: output, file layouts, diagrams
PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "shell"}

# (document, the block's first line): why it does not run here.
NOT_RUN: dict[tuple[str, str], str] = {
    ("README.md", "make demo"): "creates .venv and installs from the package indexes (network); the demo is "
                                "tests/test_cli.py's",
    ("README.md", "pip install torch --index-url"): "installs from the package indexes (network)",
    ("docs/development.md", "make test"): "creates .venv and installs from the package indexes (network), then "
                                          "runs the whole suite",
    ("docs/performance.md", "python benchmarks/torch_integration.py"): "benchmarks of 3 to 15 minutes each",
    ("docs/alerts.md", "otelprof webhook --host 0.0.0.0"): "a server that runs until stopped, for control "
                                                           "endpoints in a cluster; tests/test_webhook.py runs it",
    ("docs/development.md", "lw = c.long_step_window"): "a fragment of step_alerts.py's alerts(c): "
        "tests/test_alert_declarations.py adds such a declaration and runs everything generated from it",
    ("docs/development.md", "def long_steps(ctx: CheckContext"): "a fragment of step_checks.py, beside the "
        "declaration above",
    ("docs/storage.md", "pip install 'otelprof[storage]'"): "needs an S3 bucket; tests/test_object_storage.py "
                                                            "runs these commands against a local S3 server",
}
# (document, the start of a line of a shell block that otherwise runs): why that line does not.
LINES_NOT_RUN: dict[tuple[str, str], str] = {
    ("docs/deploy.md", "pip install otelprof"): "installs from the package index (network); the test runs the "
                                                "installed package",
    ("docs/report.md", "otelprof report --prometheus http://prometheus:9090"): "needs a cluster's Prometheus; "
        "tests/test_report_prometheus.py runs it against a real one",
}
# (document, the block's first line): the file name the document gives the block, which later blocks use.
FILES: dict[tuple[str, str], str] = {
    ("docs/tensors.md", "from otelprof.analysis.check_rules import Rule"): "my_rules.py",
    ("docs/tensors.md", "rules:"): "my_rules.yaml",
    ("docs/alerts.md", "selector: 'namespace=\"ml\"'"): "mixin.yaml",
    ("docs/mixin-settings.md", "input_bound_threshold: 0.4"): "mixin.yaml",
}
# Commands a FILES entry is checked with: it is what the document says it is.
FILE_CHECKS: dict[str, str] = {"mixin.yaml": "otelprof mixin --config mixin.yaml -o mixin-from-config/"}
# Exit statuses a command may end with besides 0, by its start.
EXIT_STATUSES = {"otelprof check": [0, 1]}  # 1: a check fired

# What docs/*.md's python fragments take as given: a model, its optimizer and loader, a checkpoint function.
PRELUDE = '''
import torch

import otelprof

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,))), batch_size=32)


def save_checkpoint(model):
    torch.save(model.state_dict(), "checkpoint.pt")
'''
# What one block takes as given besides PRELUDE, run just before it: (document, the block's first line): code.
TRAINERS = '''
import lightning.pytorch
import transformers


class Module(lightning.pytorch.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(4, 8), torch.randint(0, 2, (4,)))
        return torch.utils.data.DataLoader(data, batch_size=4)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.cross_entropy(self.layer(x), labels)}


module, model = Module(), Model()
args = transformers.TrainingArguments(output_dir="hf-output", max_steps=4, per_device_train_batch_size=4,
                                      report_to=[], use_cpu=True, save_strategy="no")
ds = [{"x": torch.randn(8), "labels": torch.tensor(i % 2)} for i in range(16)]
'''
CONTEXT: dict[tuple[str, str], str] = {
    ("docs/pytorch.md", "from otelprof.integrations.lightning import"): TRAINERS,  # a module, a model, args, ds
}
TRAIN_PY = ("README.md", "import torch")  # README.md's train.py: the fixture run and `python train.py`


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    info: str
    code: str

    @property
    def first(self) -> str:
        return next((line.strip() for line in self.code.splitlines() if line.strip()), "")

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"

    def matches(self, key: tuple[str, str]) -> bool:
        return key[0] == self.document and self.first.startswith(key[1])


def blocks(path: Path) -> list[Block]:
    tokens = MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))
    document = path.relative_to(ROOT).as_posix()
    return [Block(document, t.map[0] + 1 if t.map else 0, t.info.strip().split(" ")[0].lower(), t.content)
            for t in tokens if t.type in ("fence", "code_block")]


ALL_BLOCKS = [b for path in DOCUMENTS for b in blocks(path)]


def _shell_lines(code: str) -> list[str]:
    """Logical lines (continuations joined), comment-only and blank lines left out."""
    lines, pending = [], ""
    for raw in code.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def _command(line: str) -> str:
    """The program a shell line runs, after any VAR=value assignments."""
    words = shlex.split(line, comments=True)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    return words[0] if words else ""


def _line_not_run(block: Block, line: str) -> str | None:
    return next((reason for (doc, start), reason in LINES_NOT_RUN.items()
                 if doc == block.document and line.startswith(start)), None)


def steps(document: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The driver's steps for one document, and the blocks (or lines) that are neither run nor listed."""
    out: list[dict[str, Any]] = []
    unhandled: list[str] = []
    prelude = document != "README.md"
    for block in (b for b in ALL_BLOCKS if b.document == document):
        if block.info in ILLUSTRATIONS or any(block.matches(key) for key in NOT_RUN):
            continue
        name = next((n for key, n in FILES.items() if block.matches(key)), None)
        if name is not None:
            out.append({"where": block.where, "kind": "file", "name": name, "code": block.code})
            if name in FILE_CHECKS:
                out.append({"where": block.where, "kind": "shell", "code": FILE_CHECKS[name], "expect": [0]})
            if name.endswith((".yaml", ".yml")):
                out.append({"where": block.where, "kind": "yaml", "code": block.code})
            continue
        if block.info in PYTHON:
            if prelude:
                out.append({"where": "PRELUDE", "kind": "python", "code": PRELUDE})
                prelude = False
            for key, code in CONTEXT.items():
                if block.matches(key):
                    out.append({"where": f"CONTEXT of {block.where}", "kind": "python", "code": code})
            out.append({"where": block.where, "kind": "python", "code": block.code})
        elif block.info in SHELL:
            for line in _shell_lines(block.code):
                if _line_not_run(block, line) is not None:
                    continue
                if _command(line) not in ("otelprof", "python"):
                    unhandled.append(f"{block.where}: {line}")
                    continue
                expect = next((codes for start, codes in EXIT_STATUSES.items() if line.startswith(start)), [0])
                out.append({"where": f"{block.where}: {line}", "kind": "shell", "code": line, "expect": expect})
        elif block.info in ("yaml", "yml", "json"):
            out.append({"where": block.where, "kind": "json" if block.info == "json" else "yaml",
                        "code": block.code})
        else:
            unhandled.append(f"{block.where}: ```{block.info} {block.first}")
    return out, unhandled


def _train_py() -> str:
    [block] = [b for b in ALL_BLOCKS if b.matches(TRAIN_PY) and b.info in PYTHON]
    return block.code


def _env(tmp: Path, bin_dir: Path) -> dict[str, str]:
    """No network, nothing of this test's environment: recordings into the directory, one thread (a shared CPU)."""
    drop = {v.name for v in ev.ENV_VARS} | {"PYTEST_ADDOPTS", "TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("OTEL_")}
    env.update({"PYTHONPATH": str(ROOT), "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
                "OTELPROF_RECORD_DIR": str(tmp / "otelprof-runs"), "OMP_NUM_THREADS": "1"})
    return env


def _bin(tmp: Path) -> Path:
    """`python` and `otelprof` as a reader would have them: this interpreter and its otelprof."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, command in (("python", f'exec {shlex.quote(sys.executable)} "$@"'),
                          ("otelprof", f'exec {shlex.quote(sys.executable)} -m otelprof "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{command}\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of README.md's train.py, recorded once and copied into each page's directory."""
    tmp = tmp_path_factory.mktemp("fixture-run")
    (tmp / "train.py").write_text(_train_py(), encoding="utf-8")
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp, env=_env(tmp, _bin(tmp)), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "otelprof-runs"


def _run_document(document: str, tmp: Path, runs: Path | None) -> None:
    todo, unhandled = steps(document)
    assert not unhandled, f"blocks neither run nor listed in NOT_RUN / LINES_NOT_RUN / ILLUSTRATIONS: {unhandled}"
    (tmp / "train.py").write_text(_train_py(), encoding="utf-8")
    if runs is not None:
        shutil.copytree(runs, tmp / "otelprof-runs")
    (tmp / "steps.json").write_text(json.dumps(todo), encoding="utf-8")
    results = tmp / "results.jsonl"
    done = subprocess.run([sys.executable, str(DRIVER), "steps.json", str(results)], cwd=tmp,
                          env=_env(tmp, _bin(tmp)), capture_output=True, text=True, timeout=1800)
    ran = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()] if results.exists() else []
    failed = [r for r in ran if not r["ok"]]
    assert not failed, f"{failed[0]['where']} failed:\n{failed[0]['detail']}"
    assert done.returncode == 0 and len(ran) == len(todo), f"driver exit {done.returncode}: {done.stderr[-3000:]}"


RUNNABLE = sorted({b.document for b in ALL_BLOCKS} - {"README.md"})


def test_readme_blocks_run_on_their_own(tmp_path: Path) -> None:
    """README.md's Quickstart records its own runs, nothing given to it, and they hold what it says."""
    _run_document("README.md", tmp_path, None)
    marked, instrumented = (read_recording(run).ranks[0] for run in sorted((tmp_path / "otelprof-runs").iterdir()))
    assert {s.phase for s in marked.steps} == {"train", "eval"}
    assert "initialization" in {a.name for a in marked.annotations}
    for rank, regions in ((marked, {"forward", "backward", "optimizer"}),
                          (instrumented, {"dataloader", "forward", "backward", "optimizer"})):
        train = [s for s in rank.steps if s.phase == "train"]
        assert train and all({a.name for a in s.annotations} == regions for s in train)
        assert all({"loss", "samples"} <= set(s.scalars) for s in train)
    assert (tmp_path / "report.html").is_file() and (tmp_path / "trace.json").is_file()


@pytest.mark.parametrize("document", RUNNABLE)
def test_doc_blocks_run(document: str, fixture_run: Path, tmp_path: Path) -> None:
    _run_document(document, tmp_path, fixture_run)


def test_every_block_is_run_or_listed() -> None:
    unhandled = [u for b in sorted({b.document for b in ALL_BLOCKS}) for u in steps(b)[1]]
    assert not unhandled, unhandled
    for table in (NOT_RUN, FILES, CONTEXT):
        stale = [key for key in table if not any(b.matches(key) for b in ALL_BLOCKS)]
        assert not stale, f"listed blocks that no longer exist: {stale}"
    stale_lines = [key for key in LINES_NOT_RUN if not any(
        b.document == key[0] and any(line.startswith(key[1]) for line in _shell_lines(b.code)) for b in ALL_BLOCKS)]
    assert not stale_lines, f"listed lines that no longer exist: {stale_lines}"
    assert len([b for b in ALL_BLOCKS if b.matches(TRAIN_PY) and b.info in PYTHON]) == 1


def test_a_block_neither_run_nor_listed_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = [Block("docs/alerts.md", 1, "sh", "kubectl apply -k deploy/\n"), Block("docs/alerts.md", 2, "", "x\n")]
    monkeypatch.setattr(sys.modules[__name__], "ALL_BLOCKS", ALL_BLOCKS + extra)
    unhandled = steps("docs/alerts.md")[1]
    assert unhandled == ["docs/alerts.md:1: kubectl apply -k deploy/", "docs/alerts.md:2: ``` x"]


def test_whole_prometheus_and_alertmanager_files_are_checked_by_their_tools() -> None:
    require_binary("promtool")
    require_binary("amtool")
    rules = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n"
    ok, detail = check_yaml(rules)
    assert ok and detail.startswith("promtool check rules"), detail
    assert not check_yaml(rules.replace("up == 0", "up =="))[0]
    route = "route:\n  receiver: r\nreceivers:\n  - name: r\n"
    assert check_yaml(route)[0] and not check_yaml(route.replace("receiver: r", "receiver: nobody"))[0]
    assert check_yaml("env:\n  - {name: A, value: b}\n") == (True, "parsed")  # a fragment: parsed only
    assert not check_yaml("a: [1\n")[0]
