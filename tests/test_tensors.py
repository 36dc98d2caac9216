"""Tensor collections: selection, saved steps, reductions, the trial API, the per-layer rules and custom rules.

The verdict suite trains small real models with one injected pathology each under ``otelprof run`` (collections
from the environment, no code change) and checks that ``otelprof check`` names the right layer, and that the
healthy run of the same model raises nothing at warning or above.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from otelprof.config import Config, ConfigError
from otelprof.integrations.tensors import TensorCollector
from otelprof.recording.tensors import read_trial
from otelprof.tensor_collections import Collection, parse_collections

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).with_name("tensor_job.py")
ALL = "gradients,weights,biases,outputs,optimizer"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            "OTELPROF_RECORD_DIR": str(tmp_path / "runs"), "OTELPROF_SYSTEM_METRICS": "false",
            "OTELPROF_SAVE_INTERVAL": "5",
            # no periodic operator-profiling window: on a loaded machine its event cap warns (not about tensors)
            "OTELPROF_PROFILE_EVERY": "0", **extra}


def run_job(tmp_path: Path, scenario: str, steps: int = 60, collections: str | None = ALL,
            via_run: bool = True, **env: str) -> tuple[Path, dict[str, Any]]:
    """Train ``scenario`` (tests/tensor_job.py); the rank directory of its recording and what the loop printed."""
    extra = {"OTELPROF_RUN_ID": scenario, **env}
    if collections is not None:
        extra["OTELPROF_COLLECTIONS"] = collections
    prefix = [sys.executable, "-m", "otelprof", "run", "-q", "--"] if via_run else []
    result = subprocess.run([*prefix, sys.executable, str(JOB), scenario, str(steps)], env=_env(tmp_path, **extra),
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "otelprof:" not in result.stderr, result.stderr  # no warning: nothing went wrong
    return tmp_path / "runs" / scenario / "rank-0", json.loads(result.stdout.strip().splitlines()[-1])


def check(run: Path, *options: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(run), "--json", *options],
                            env=_env(run), capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, {c["alert"]: c for c in json.loads(result.stdout)["checks"]}


# ---------------------------------------------------------------------------------------------- selection

def test_the_collections_variable_parses_names_regexes_intervals_and_ranges() -> None:
    parsed = parse_collections(r"gradients, weights@50 ,attn=attn\.[0-9]+/output!bias#10-200")
    assert parsed == (Collection("gradients"), Collection("weights", every=50),
                      Collection("attn", r"attn\.[0-9]+/output", "bias", None, 10, 200))
    attn = parsed[2]
    assert attn.selects("outputs", "attn.3/output") and not attn.selects("outputs", "mlp.3/output")
    assert not Collection("g", include="fc", exclude="bias").selects("gradients", "gradients/fc.bias")
    assert not Collection("gradients").selects("weights", "fc.weight")
    assert [n for n in range(10) if attn.saves(n, 5)] == []  # before its range
    assert [n for n in range(10, 26) if attn.saves(n, 5)] == [10, 15, 20, 25]
    assert [n for n in range(0, 220) if Collection("x", "a", every=50, start=10, end=200).saves(n, 5)] == [
        10, 60, 110, 160]
    assert [n for n in range(12) if Collection("weights").saves(n, 4)] == [0, 4, 8]


@pytest.mark.parametrize("bad", ["mine", "weights=(", "gradients@0", "x=a#9-3", "gradients,gradients", "a b"])
def test_a_bad_collections_value_is_a_clear_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="OTELPROF_COLLECTIONS"):
        Config.from_env({"OTELPROF_COLLECTIONS": bad}, strict=True)
    assert Config.from_env({"OTELPROF_COLLECTIONS": "gradients@3", "OTELPROF_SAVE_INTERVAL": "7"}).save_interval == 7


# ---------------------------------------------------------------------------------------------- in process

def test_hooks_only_at_saved_steps_and_reductions_equal_torch_own(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    collector = TensorCollector((Collection("gradients"), Collection("outputs", every=3, start=3, end=6),
                                 Collection("optimizer")), every=4, directory=tmp_path, bins=4)
    collector.add_model(model)
    collector.start(discover=False)
    expected: dict[int, dict[str, Any]] = {}
    hooked = []
    try:
        for step in range(10):
            hooked.append(bool(model[1]._forward_hooks))
            x = torch.randn(5, 6)
            hidden = torch.tanh(model[0](x))
            out = model(x)
            out.pow(2).mean().backward()
            grad = model[2].weight.grad.clone()
            before = model[2].weight.detach().clone()
            optimizer.step()
            optimizer.zero_grad()
            update = model[2].weight.detach() - before
            expected[step] = {"grad": grad, "hidden": hidden.detach(), "ratio": (update.norm() / before.norm()).item()}
    finally:
        collector.close()
    assert hooked == [n in (3, 6) for n in range(10)]  # forward hooks only for the outputs' saved steps
    assert not model[1]._forward_hooks
    trial = read_trial(tmp_path)
    assert trial.steps() == [0, 3, 4, 6, 8]
    assert trial.steps("gradients/2.weight") == [0, 4, 8]
    assert trial.tensor_names(collection="outputs") == ["0/output", "1/output", "2/output"]
    assert trial.module("1/output") == "Tanh"
    for step in (0, 4, 8):
        grad = expected[step]["grad"]
        assert trial.reduction("gradients/2.weight", step, "mean", abs=True) == pytest.approx(grad.abs().mean().item())
        assert trial.reduction("gradients/2.weight", step, "mean") == pytest.approx(grad.mean().item(), abs=1e-7)
        assert trial.reduction("gradients/2.weight", step, "l2") == pytest.approx(grad.norm().item())
        assert trial.reduction("gradients/2.weight", step, "max") == pytest.approx(grad.max().item())
        assert trial.reduction("gradients/2.weight", step, "std") == pytest.approx(grad.std(unbiased=False).item())
        assert trial.reduction("update/2.weight", step, "ratio") == pytest.approx(expected[step]["ratio"], rel=1e-4)
        assert sum(trial.record("gradients/2.weight", step).histogram) == grad.numel()
    for step in (3, 6):
        hidden = expected[step]["hidden"]
        saturated = (hidden.abs() > 0.99).float().mean().item()
        assert trial.reduction("1/output", step, "saturated") == pytest.approx(saturated)
        assert trial.reduction("1/output", step, "min") == pytest.approx(hidden.min().item())
    with pytest.raises(KeyError, match="no tensor"):
        trial.reduction("gradients/2.weight", 1, "mean")


def test_a_failing_hook_turns_collections_off_with_one_warning_and_training_goes_on(tmp_path: Path,
                                                                                    caplog: Any) -> None:
    model = nn.Sequential(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    collector = TensorCollector((Collection("gradients", every=1),), every=1, directory=tmp_path / "x" / "y")
    collector.add_model(model)
    collector.start(discover=False)
    (tmp_path / "x").write_text("a file where the directory should be")
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    collector.close()
    assert collector.dropped > 0
    assert [r.message for r in caplog.records if "tensors.jsonl" in r.message][:1]
    assert read_trial(tmp_path / "x" / "y").empty


def test_tensor_metrics_sum_the_saved_reductions_flag_as_offline_and_fold_past_the_cap(tmp_path: Path) -> None:
    from otelprof import semconv as sc
    from otelprof.analysis import tensors as tensor_rules
    from otelprof.integrations.tensor_metrics import TensorMetrics
    from otelprof.runtime.metrics import MetricRegistry

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        model[2].bias.fill_(-100.0)  # ReLU 3 dead
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    registry = MetricRegistry({k: "x" for k in sc.IDENTITY_LABELS})
    rank_dir = tmp_path / "run" / "rank-0"
    collector = TensorCollector((Collection("gradients"), Collection("outputs")), every=2, directory=rank_dir)
    collector.metrics = TensorMetrics(registry, series_max=2)
    collector.add_model(model)
    collector.start(discover=False)
    grads: dict[int, float] = {}
    try:
        for step in range(9):
            model(torch.randn(5, 6)).pow(2).mean().backward()
            grads[step] = model[0].weight.grad.norm().item()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        collector.close()
    values = {name: dict(i.values) for name, i in registry._instruments.items()  # type: ignore[attr-defined]
              if hasattr(i, "values")}
    saves = values[sc.TENSOR_SAVES.name]
    # two tensors of each collection by name (the first read back), the rest as "other"
    assert saves[("gradients", "gradients/0.weight")] == 5  # steps 0, 2, 4, 6, 8
    assert saves[("gradients", "other")] == 5 * 4  # 6 gradients: 2 named, 4 folded
    assert {t for c, t in saves if c == "outputs"} == {"0/output", "1/output", "other"}
    summed = values[sc.TENSOR_SUMMED.name]
    assert summed[("gradients", "gradients/0.weight", "l2")] == pytest.approx(sum(grads[n] for n in (0, 2, 4, 6, 8)),
                                                                               rel=1e-5)
    folded = values[sc.SERIES_FOLDED.name]
    assert folded[(sc.TENSOR_SAVES.name,)] == 4 * 5 + 3 * 5  # 4 gradients and 3 outputs past the cap, 5 saves
    # the flags are the offline verdicts, tensor by tensor (those past the cap of flagged tensors as "other")
    flagged = values[sc.TENSOR_FLAGGED.name]
    assert flagged[("DeadRelu", "outputs", "3/output")] == 4  # saved steps 2, 4, 6, 8: held since step 0
    trial = read_trial(rank_dir)
    offline = set()
    for name, rule in tensor_rules._JUDGES.items():
        verdict = tensor_rules.Verdict()
        rule(trial, verdict, 0)
        offline |= {(name.removeprefix("Otelprof"), s.removeprefix("rank 0 ")) for s in verdict.subjects}
    live = {(check, tensor) for check, _, tensor in flagged}
    assert {item for item in live if item[1] != "other"} <= offline
    assert {check for check, _ in offline} == {check for check, _ in live}


def test_full_tensors_of_selected_names_are_saved_within_both_byte_budgets(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    collector = TensorCollector((Collection("gradients"), Collection("weights"), Collection("outputs")), every=3,
                                directory=tmp_path)
    collector.save = re.compile(r"^(gradients/)?0\.weight$|^1/output$")
    # in the order a step saves them: 1/output (5 x 8 floats, 160 bytes) in the forward, 0.weight (32 floats,
    # 128 bytes) and its gradient (128 bytes) before optimizer.step(): the gradient no longer fits the step
    collector.save_max_bytes = 160 + 128 + 127
    collector.save_total_bytes = 3 * (160 + 128)  # three saved steps of them; the fourth is dropped
    collector.add_model(model)
    collector.start(discover=False)
    seen: dict[int, dict[str, list[float]]] = {}
    try:
        for step in range(12):
            x = torch.randn(5, 4)
            hidden = torch.relu(model[0](x)).detach()
            model(x).pow(2).mean().backward()
            seen[step] = {"0.weight": model[0].weight.detach().reshape(-1).tolist(),
                          "1/output": hidden.reshape(-1).tolist()}
            optimizer.step()
            optimizer.zero_grad()
    finally:
        collector.close()
    trial = read_trial(tmp_path)
    assert sorted(trial.full) == ["0.weight", "1/output"]
    assert sorted(trial.full["0.weight"]) == [0, 3, 6]  # step 9 is over the total budget
    for step in (0, 3, 6):
        for name, shape in (("0.weight", (8, 4)), ("1/output", (5, 8))):
            saved_shape, values = trial.full_tensor(name, step)
            assert saved_shape == shape
            assert values == pytest.approx(seen[step][name])
    assert trial.full_dropped == {0: ["gradients/0.weight"], 3: ["gradients/0.weight"], 6: ["gradients/0.weight"],
                                  9: ["1/output", "0.weight", "gradients/0.weight"]}
    assert collector.full_dropped == 6 and collector.saved_bytes == 3 * (160 + 128)
    assert (tmp_path / "tensors-full.bin").stat().st_size == 3 * (160 + 128)
    with pytest.raises(KeyError, match="no full tensor"):
        trial.full_tensor("0.weight", 9)
    assert trial.reduction("0.weight", 9, "l2") == pytest.approx(torch.tensor(seen[9]["0.weight"]).norm().item())


def _otlp_tensor_points(receiver: Any) -> dict[tuple[str, tuple[tuple[str, Any], ...]], float]:
    """The last value of every otelprof.tensor.* point the receiver got (exports are cumulative snapshots)."""
    from tests.otlp_receiver import attributes

    last: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
    for metric in (m.metric for m in receiver.metrics()):
        if metric.name.startswith("otelprof.tensor."):
            for point in metric.sum.data_points:
                value = point.as_double if point.HasField("as_double") else point.as_int
                last[(metric.name, tuple(sorted(attributes(point.attributes).items())))] = value
    return last


def test_tensor_metrics_arrive_over_otlp_with_the_flag_naming_the_layer(tmp_path: Path) -> None:
    from tests.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as receiver:
        run, _ = run_job(tmp_path, "dead_relu", steps=20, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint("http"),
                         OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_TRACES_EXPORTER="none",
                         OTEL_METRICS_EXPORTER="otlp")
        last = _otlp_tensor_points(receiver)
    flags = {dict(labels)["tensor"]: v for (name, labels), v in last.items() if name == "otelprof.tensor.flagged"
             and dict(labels)["check"] == "DeadRelu"}
    assert flags == {"3/output": 3}  # saved steps 5, 10, 15 (the condition held since step 0)
    trial = read_trial(run)
    saves = {dict(labels)["tensor"]: v for (name, labels), v in last.items() if name == "otelprof.tensor.saves"}
    assert saves["gradients/0.weight"] == len(trial.steps("gradients/0.weight")) == 4
    summed = {dict(labels)["tensor"]: v for (name, labels), v in last.items() if name == "otelprof.tensor.summed"
              and dict(labels)["reduction"] == "l2"}
    assert summed["0.weight"] == pytest.approx(sum(v for _, v in trial.series("0.weight", "l2")), rel=1e-6)


def test_without_a_recording_the_tensor_metrics_still_flag_the_layer(tmp_path: Path) -> None:
    from tests.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as receiver:
        run, _ = run_job(tmp_path, "dead_relu", steps=20, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint("http"),
                         OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_TRACES_EXPORTER="none",
                         OTEL_METRICS_EXPORTER="otlp", OTELPROF_RECORD="false")
        last = _otlp_tensor_points(receiver)
    assert not run.exists()  # nothing written
    flags = {dict(labels)["tensor"]: v for (name, labels), v in last.items() if name == "otelprof.tensor.flagged"
             and dict(labels)["check"] == "DeadRelu"}
    assert flags == {"3/output": 3}


# ---------------------------------------------------------------------------------------------- verdict suite

CASES = [
    ("vanishing", "OtelprofLayerVanishingGradient", "gradients/0.weight"),
    ("saturated", "OtelprofSaturatedActivation", "1/output"),
    ("dead_relu", "OtelprofDeadRelu", "3/output"),
    ("exploding", "OtelprofLayerExplodingTensor", "0.weight"),
    ("zero_init", "OtelprofPoorWeightInitialization", "2.weight"),
    ("zero_init", "OtelprofAllZeroTensor", "2.weight"),
    ("imbalanced", "OtelprofClassImbalance", "class 1"),
]


@pytest.mark.parametrize(("scenario", "rule", "layer"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_pathology_fires_its_rule_naming_the_layer(tmp_path: Path, scenario: str, rule: str, layer: str) -> None:
    run, _ = run_job(tmp_path, scenario)
    code, checks = check(run.parent)
    assert code == 1
    assert checks[rule]["status"] == "fired", checks[rule]
    assert f"rank 0 {layer}" in " | ".join(checks[rule]["subjects"])


def test_overtraining_fires_on_a_memorizing_run(tmp_path: Path) -> None:
    run, printed = run_job(tmp_path, "overtraining", steps=150)
    assert printed["last_loss"] < printed["first_loss"] / 100  # the loop memorized its training batch
    code, checks = check(run.parent)
    assert code == 1
    assert checks["OtelprofOvertraining"]["status"] == "fired"
    assert checks["OtelprofLayerVanishingGradient"]["status"] == "ok"  # small gradients everywhere: not vanishing


def test_a_healthy_run_raises_nothing_at_warning_or_above(tmp_path: Path) -> None:
    run, printed = run_job(tmp_path, "healthy")
    assert printed["last_loss"] < printed["first_loss"]
    code, checks = check(run.parent)
    loud = {name: c["subjects"] for name, c in checks.items() if c["fired"] and c["severity"] != "info"}
    assert loud == {}
    assert code == 0
    for rule in ("OtelprofLayerVanishingGradient", "OtelprofDeadRelu", "OtelprofWeightUpdateRatio",
                 "OtelprofClassImbalance", "OtelprofOvertraining", "OtelprofPoorWeightInitialization"):
        assert checks[rule]["status"] == "ok", rule  # judged, not "no data"
    assert checks["OtelprofSaturatedActivation"]["status"] == "no data"  # no sigmoid/tanh in this model


def test_collections_in_code_and_the_read_api_match_what_the_loop_saw(tmp_path: Path) -> None:
    run, printed = run_job(tmp_path, "code", steps=20, collections=None, via_run=False)
    trial = read_trial(run)
    assert trial.collections() == ["gradients", "weights"]
    assert trial.tensor_names(collection="gradients") == [f"gradients/{n}.{p}" for n in (0, 2, 4, 6)
                                                          for p in ("weight", "bias")]
    assert trial.tensor_names(collection="outputs") == []
    assert trial.steps("gradients/0.weight") == [0, 5, 10, 15]
    for step in ("5", "10"):
        seen = printed["seen"][step]
        assert trial.reduction("gradients/0.weight", int(step), "mean", abs=True) == pytest.approx(
            seen["grad_abs_mean"], rel=1e-5)
        assert trial.reduction("0.weight", int(step), "l2") == pytest.approx(seen["weight_l2"], rel=1e-5)
        assert trial.reduction("0.weight", int(step), "max") == pytest.approx(seen["weight_max"], rel=1e-6)
    assert all(math.isfinite(v) for v in trial.record("0.weight", 0).reductions.values())


def test_without_collections_nothing_is_saved_and_the_checks_table_is_unchanged(tmp_path: Path) -> None:
    run, _ = run_job(tmp_path, "healthy", steps=12, collections=None)
    assert not (run / "tensors.jsonl").exists()
    _, checks = check(run.parent)
    assert not [name for name in checks if name in ("OtelprofDeadRelu", "OtelprofOvertraining")]


# ---------------------------------------------------------------------------------------------- custom rules

def _doc_rule() -> str:
    text = (ROOT / "docs" / "tensors.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- custom-rule-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/tensors.md lost its custom rule example"
    return match.group(1)


def test_the_documented_custom_rule_fires_in_check(tmp_path: Path) -> None:
    rules = tmp_path / "my_rules.py"
    rules.write_text(_doc_rule(), encoding="utf-8")
    sick, _ = run_job(tmp_path, "vanishing", steps=20)
    code, checks = check(sick.parent, "--rules", str(rules))
    assert code == 1
    row = checks["TinyGradients"]
    assert row["status"] == "fired" and row["severity"] == "warning"
    assert "rank 0 gradients/0.weight" in row["subjects"]
    assert row["evaluations"] == 4  # steps 0, 5, 10, 15
    healthy, _ = run_job(tmp_path, "healthy", steps=20)
    code, checks = check(healthy.parent, "--rules", str(rules))
    assert code == 0 and checks["TinyGradients"]["status"] == "ok"


@pytest.mark.parametrize(("content", "message"), [
    ("x = (", "SyntaxError"),
    ("x = 1\n", "defines no rule"),
    ("def rule_boom(trial, step):\n    return 1 / 0\n", "rule rule_boom failed at step 0 of rank 0: ZeroDivisionError"),
    ("from otelprof.analysis.check_rules import Rule\nclass R(Rule):\n    severity = 'loud'\n", "severity 'loud'"),
])
def test_a_bad_rules_file_is_a_one_line_error_with_exit_2(tmp_path: Path, content: str, message: str) -> None:
    run, _ = run_job(tmp_path, "healthy", steps=6)
    rules = tmp_path / "rules.py"
    rules.write_text(content, encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(run.parent), "--rules", str(rules)],
                            env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_a_closure_optimizer_loop_saves_its_model_found_inside_step(tmp_path: Path) -> None:
    """L-BFGS under ``otelprof run``: the model is first called by the closure inside ``step()`` (the discovery
    lasts until the first step ends), several evaluations a step (the first one's outputs are saved), and each
    step is followed by a prediction under no_grad in train mode (not a training forward: never saved)."""
    steps = 5
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "-q", "--", sys.executable,
                             str(JOB.with_name("tensor_closure_job.py")), str(steps)],
                            env=_env(tmp_path, OTELPROF_RUN_ID="closure",
                                     OTELPROF_COLLECTIONS="gradients@2,weights@2,outputs@2,optimizer@2"),
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "otelprof:" not in result.stderr, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])["steps"]
    assert len(seen) == steps and all(s["evaluations"] > 1 for s in seen)  # several closure calls a step
    trial = read_trial(tmp_path / "runs" / "closure" / "rank-0")
    saved = [0, 2, 4]  # every 2nd of 5 steps
    weights = {"cell.weight_ih", "cell.weight_hh", "linear.weight"}
    assert set(trial.tensor_names(kind="weights")) == weights
    for name in weights:  # step 0 too: the weights as they were when the closure first called the model
        assert trial.steps(name) == saved
        for n in saved:
            assert trial.reduction(name, n, "l2") == pytest.approx(seen[n]["weights"][name], rel=1e-5)
    assert seen[0]["gradients"] == {}
    for name in seen[2]["gradients"]:  # none before step 0: no backward has run yet
        assert trial.steps(f"gradients/{name}") == [2, 4]
        for n in (2, 4):
            assert trial.reduction(f"gradients/{name}", n, "l2") == pytest.approx(seen[n]["gradients"][name],
                                                                                   rel=1e-5)
    assert set(seen[2]["gradients"]) == {"cell.weight_ih", "cell.weight_hh", "cell.bias_ih", "cell.bias_hh",
                                         "linear.weight", "linear.bias"}
    assert trial.steps("cell/output") == saved and trial.steps("update/linear.weight") == saved
    for n in saved:  # the step's first training forward: the first evaluation, not the prediction (3 rows)
        assert trial.reduction("cell/output", n, "l2") == pytest.approx(seen[n]["first_output"], rel=1e-5)
        assert trial.reduction("update/linear.weight", n, "l2") == pytest.approx(
            seen[n]["updates"]["linear.weight"], rel=1e-5)
    lines = [json.loads(line) for line in (tmp_path / "runs/closure/rank-0/tensors.jsonl").read_text().splitlines()]
    shapes = {tuple(x["shape"]) for x in lines if x.get("name") == "cell/output"}
    assert shapes == {tuple(seen[0]["first_output_shape"])} == {(7, 6)}  # the training batch, never the 3 predicted


# ---------------------------------------------------------------------------------------------- report heatmap

def test_the_report_draws_per_layer_norms_and_shows_the_layers_a_check_named(tmp_path: Path) -> None:
    run, _ = run_job(tmp_path, "dead_relu", steps=20)
    out = {}
    for fmt in ("json", "html"):
        result = subprocess.run([sys.executable, "-m", "otelprof", "report", str(run.parent), "-q", "-o",
                                 str(tmp_path / f"report.{fmt}")], env=_env(tmp_path), capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        out[fmt] = (tmp_path / f"report.{fmt}").read_text(encoding="utf-8")
    layers = json.loads(out["json"])["layers"]
    trial = read_trial(run)
    assert layers["rank"] == 0 and layers["kind"] == "gradients"
    assert layers["steps"] == [0, 5, 10, 15]
    rows = {row["tensor"]: row for row in layers["rows"]}
    # every gradient, and the ReLU output the dead-ReLU check named (first, with the check)
    assert set(trial.tensor_names(kind="gradients")) | {"3/output"} <= set(rows)
    assert layers["rows"][0]["tensor"] in {name for name, row in rows.items() if row["named_by"]}
    assert "OtelprofDeadRelu" in rows["3/output"]["named_by"]
    assert ["OtelprofDeadRelu", "rank 0 3/output"] in layers["named"]
    for step, value in zip(layers["steps"], rows["gradients/4.weight"]["values"]):
        assert value == pytest.approx(trial.reduction("gradients/4.weight", step, "l2"))
    shades = [s for row in layers["rows"] for s in row["shades"] if s is not None]
    assert min(shades) == 0.0 and max(shades) == 1.0
    nav = out["html"][out["html"].index("<nav>"):out["html"].index("</nav>")]
    assert nav.endswith('<a href="#layers">Layers</a>')  # listed in the navigation, after the other sections
    section = out["html"][out["html"].index('<section id="layers">'):]
    section = section[:section.index("</section>")]
    assert "rank 0 3/output" in section and "3/output <b" in section
    assert section.count('<tr><th style="text-align:left;font-weight:normal') == len(rows)  # one heatmap row each


def test_a_report_without_collections_has_no_layers_section(tmp_path: Path) -> None:
    run, _ = run_job(tmp_path, "healthy", steps=6, collections=None)
    result = subprocess.run([sys.executable, "-m", "otelprof", "report", str(run.parent), "-q", "-o",
                             str(tmp_path / "report.html")], env=_env(tmp_path), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'id="layers"' not in html and 'href="#layers"' not in html and 'href="#gpu-memory"' in html


# ---------------------------------------------------------------------------------------------- custom live rules

def _doc_live_rule() -> str:
    text = (ROOT / "docs" / "tensors.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- custom-live-rule-example -->\n```yaml\n(.*?)```", text, re.S)
    assert match, "docs/tensors.md lost its custom live rule example"
    return match.group(1)


def test_the_documented_custom_live_rule_is_validated_written_and_fires_in_promtool(tmp_path: Path) -> None:
    from tests.servers import require_binary

    rules = tmp_path / "my_rules.yaml"
    rules.write_text(_doc_live_rule(), encoding="utf-8")
    out = tmp_path / "monitoring"
    result = subprocess.run([sys.executable, "-m", "otelprof", "mixin", "-o", str(out), "--set",
                             f"custom_rules={rules}"], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "## OtelprofFirstLayerGradientTiny" in (out / "runbook.md").read_text(encoding="utf-8")
    promtool = require_binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(out / "otelprof-alerts.yaml")], capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    ident = 'job_name="j", rank="0", local_rank="0", node="n"'
    series = []
    # a saved step a minute; layer 0's mean |gradient| collapses from 1e-3 to 1e-8 at 20 min, layer 2's stays
    for layer, late in (("0", 1e-8), ("2", 1e-3)):
        tensor = f'collection="gradients", tensor="gradients/{layer}.weight"'
        series += [{"series": f'otelprof_tensor_summed{{{ident}, {tensor}, reduction="abs_mean"}}',
                    "values": f"0+0.001x20 {0.02 + late!r}+{late!r}x50"},
                   {"series": f"otelprof_tensor_saves_total{{{ident}, {tensor}}}", "values": "0+1x70"}]
    alert = "OtelprofFirstLayerGradientTiny"
    firing = (f'ALERTS{{alertname="{alert}", alertstate="firing", severity="warning", {ident}, '
              'collection="gradients", tensor="gradients/0.weight"}')
    (out / "custom_test.yaml").write_text(json.dumps({
        "rule_files": ["otelprof-alerts.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series,
                   "alert_rule_test": [{"eval_time": "45m", "alertname": alert, "exp_alerts": []}],
                   "promql_expr_test": [{"expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}',
                                         "eval_time": "60m", "exp_samples": [{"labels": firing, "value": 1}]}]}]}))
    unit = subprocess.run([promtool, "test", "rules", "custom_test.yaml"], cwd=out, capture_output=True, text=True,
                          timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr


@pytest.mark.parametrize(("content", "message"), [
    ('{"rules": [{"alert": "X1x", "expr": "not_a_metric > 1", "severity": "warning", "summary": "s", '
     '"meaning": "m", "todo": "t"}]}', "not in otelprof's catalog: not_a_metric"),
    ('{"rules": [{"alert": "Mine", "expr": "up == 0", "severity": "warning", "summary": "s", "meaning": "m"}]}',
     "missing todo"),
    ('{"rules": [{"alert": "DeadRelu", "expr": "up == 0", "severity": "warning", "summary": "s", "meaning": "m", '
     '"todo": "t"}]}', "'DeadRelu' is already defined"),
    ('{"rules": [{"alert": "Mine", "expr": "up == 0", "severity": "loud", "summary": "s", "meaning": "m", '
     '"todo": "t"}]}', "severity must be one of"),
    ('{"rules": [{"alert": "Mine", "expr": "up == 0", "for": "soon", "severity": "info", "summary": "s", '
     '"meaning": "m", "todo": "t"}]}', "not a duration"),
    ('{"rules": []}', "a list of 1 to"),
    ("{", "custom rules"),
])
def test_a_bad_custom_rules_file_is_a_one_line_error_with_exit_2(tmp_path: Path, content: str, message: str) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(content, encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "otelprof", "mixin", "-o", str(tmp_path / "out"), "--set",
                             f"custom_rules={rules}"], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_full_tensors_from_the_environment_under_otelprof_run(tmp_path: Path) -> None:
    run, _ = run_job(tmp_path, "healthy", steps=12, collections="weights,gradients",
                     OTELPROF_TENSOR_SAVE=r"^(gradients/)?0\.weight$")
    trial = read_trial(run)
    assert {name: sorted(steps) for name, steps in trial.full.items()} == {
        "0.weight": [0, 5, 10], "gradients/0.weight": [0, 5, 10]}
    shape, values = trial.full_tensor("gradients/0.weight", 5)
    assert shape == (32, 16)
    grad = torch.tensor(values)
    assert grad.norm().item() == pytest.approx(trial.reduction("gradients/0.weight", 5, "l2"), rel=1e-5)
    assert grad.abs().mean().item() == pytest.approx(trial.reduction("gradients/0.weight", 5, "abs_mean"), rel=1e-5)
    assert trial.full_dropped == {}


def test_bad_full_tensor_settings_are_clear_config_errors() -> None:
    with pytest.raises(ConfigError, match="OTELPROF_TENSOR_SAVE"):
        Config.from_env({"OTELPROF_TENSOR_SAVE": "fc(", "OTELPROF_COLLECTIONS": "weights"}, strict=True)
    with pytest.raises(ConfigError, match="OTELPROF_TENSOR_SAVE_MAX_BYTES"):
        Config.from_env({"OTELPROF_TENSOR_SAVE_MAX_BYTES": "-1"}, strict=True)
    config = Config.from_env({"OTELPROF_TENSOR_SAVE": r"^fc1\.weight$", "OTELPROF_TENSOR_SAVE_MAX_BYTES": "1024"})
    assert (config.tensor_save, config.tensor_save_max_bytes, config.tensor_save_total_bytes) == (
        r"^fc1\.weight$", 1024, 256 * 2**20)
