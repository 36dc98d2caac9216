"""The diagnosis on the first screen: a real input-bound PyTorch loop (a slow Dataset, no loader workers) recorded
with ``otelprof run``, and a steady run; the report opened in headless Chromium at 1280 x 900 puts the input-bound
finding, with this run's numbers and its action, in the first 900 px, and the steady run's first screen says it is
healthy. ``otelprof check`` leads with the same diagnosis, as text and JSON."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otelprof.analysis.dataloader import wait_histogram
from otelprof.analysis.diagnosis import CAUSE, SYMPTOM, diagnosis_dict
from otelprof.analysis.report import build_report, load
from otelprof.analysis.stats import Histogram, quantile
from otelprof.cli.report import resolve_run
from otelprof.mixin import MixinConfig
from otelprof.mixin.config import with_overrides
from otelprof.report import svg
from otelprof.report.formatting import size
from otelprof.report.html import render
from tests.test_report import CHROMIUM_FLAGS, chromium, otelprof
from tests.test_report_fixtures import T0, manifest, small_samples, step_line, write_rank

FIRST_SCREEN = 900
SLEEP_PER_SAMPLE = 0.002
BATCH = 8

INPUT_BOUND_LOOP = f"""
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):  # decoding from a slow store: {SLEEP_PER_SAMPLE * BATCH * 1000:g} ms per batch
    def __len__(self):
        return 60 * {BATCH}
    def __getitem__(self, i):
        time.sleep({SLEEP_PER_SAMPLE})
        return torch.randn(16), i % 4

torch.manual_seed(0)
torch.set_num_threads(1)  # a tiny model: intra-op threads only contend for the cores
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(Slow(), batch_size={BATCH}, num_workers=0)
fetch = total = 0.0
steps = 0
it = iter(loader)
while True:
    began = time.perf_counter()
    try:
        x, y = next(it)
    except StopIteration:
        break
    fetched = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    fetch += fetched - began
    total += time.perf_counter() - began
    steps += 1
json.dump({{"steps": steps, "fetch": fetch, "total": total}}, open(sys.argv[1], "w"))
"""


def record_input_bound(root: Path) -> tuple[Path, dict[str, Any]]:
    """Run the loop under ``otelprof run``; the recording and what the loop measured itself."""
    script, mine = root / "loop.py", root / "loop.json"
    script.write_text(INPUT_BOUND_LOOP)
    result = subprocess.run([sys.executable, "-m", "otelprof", "run", "--", sys.executable, str(script), str(mine)],
                            capture_output=True, text=True, timeout=300, cwd=root,
                            env={**_env(), "OTELPROF_RECORD_DIR": str(root / "runs")})
    assert result.returncode == 0, result.stderr
    return resolve_run(str(root / "runs")), json.loads(mine.read_text())


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OTELPROF_")}


def steady_run(root: Path) -> Path:
    """200 steady train steps of 100 ms (data 2 ms, forward 40 ms, backward 50 ms), two busy GPUs."""
    run = root / "steady"
    steps = []
    t = T0 + 5
    for n in range(200):
        d = 0.1 + 0.002 * (n % 5)
        steps.append(step_line("train", n, t, d, [("dataloader", 0.0, 0.002, 0), ("forward", 0.002, 0.04, 0),
                                                  ("backward", 0.042, 0.05, 0)], {"loss": 2.0 - n * 0.005}))
        t += d
    life = {"process_start": T0, "init": T0 + 0.5, "first_step_start": T0 + 5, "last_step_end": t, "shutdown": t + 1}
    samples = small_samples(T0 + 10)
    for i, sample in enumerate(samples):
        for gpu in sample["gpu"].values():
            gpu["u"] = 0.9 + 0.01 * (i % 3)
    write_rank(run, 0, manifest(lifecycle=life, run_id="steady"), steps, samples)
    return run


def first_screen(tmp_path: Path, html: str, element: str) -> dict[str, Any]:
    """Open the page in Chromium at 1280 x 900 and measure ``element`` (a CSS selector): a copy of the page
    carries a script that writes the element's box and the first screen's text into the DOM, read back with
    --dump-dom."""
    probe = ("<script>addEventListener('load', () => { const e = document.querySelector(" + json.dumps(element)
             + "); const r = e ? e.getBoundingClientRect() : null; const out = document.createElement('pre');"
             " out.id = 'probe'; const seen = [...document.querySelectorAll('main *')].filter(n => "
             "n.children.length === 0 && n.getBoundingClientRect().top < innerHeight).map(n => n.textContent);"
             " out.textContent = JSON.stringify({box: r && {top: r.top, bottom: r.bottom}, width: innerWidth,"
             " height: innerHeight, scroll: document.documentElement.scrollWidth, seen: seen.join(' | '),"
             " nav: document.querySelector('nav').getBoundingClientRect().bottom,"
             " last: [...document.querySelectorAll('nav a')].map(a => a.getBoundingClientRect().right)"
             ".reduce((a, b) => Math.max(a, b), 0)}); document.body.appendChild(out); });</script>")
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", probe + "</body>"), encoding="utf-8")
    result = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                             "--window-size=1280,900", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stdout[-2000:]
    data: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")
                                      .replace("&lt;", "<").replace("&gt;", ">"))
    png = tmp_path / "first-screen.png"
    shot = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--window-size=1280,900", f"--screenshot={png}", (tmp_path / "report.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot.stderr
    return data


def test_an_input_bound_run_leads_with_waiting_for_data_in_the_first_screen(tmp_path: Path) -> None:
    run, mine = record_input_bound(tmp_path)
    report = build_report(load(run))
    d = report.diagnosis
    assert not d.healthy
    top = d.findings[0]
    assert (top.key, top.kind, top.section) == ("input-bound", CAUSE, "dataloader")
    # the cost is this run's: what the loop measured itself around next(iterator), within timing noise
    loop_share = mine["fetch"] / mine["total"]
    assert loop_share > 0.5 and top.cost is not None and abs(top.cost - loop_share) < 0.1, (top.cost, loop_share)
    assert f"{top.cost * 100:.1f} % of train step time" in top.cost_text
    # the action comes from this run's loader and CPUs: 0 workers, num_workers = the CPUs available
    [config] = report.dataloader.loaders
    assert config.workers == 0 and config.cpus_available
    assert f"0 worker(s) on {config.cpus_available:g} CPUs → num_workers={max(1, int(config.cpus_available))}" \
        in top.action
    # causes before symptoms: an outlier or idle-GPU finding never ranks above the data loader
    kinds = [f.kind for f in d.findings]
    assert kinds.index(CAUSE) == 0 and all(k != SYMPTOM for k in kinds[:kinds.index(CAUSE) + 1])
    html = render(report)
    (tmp_path / "report.html").write_text(html, encoding="utf-8")
    seen = first_screen(tmp_path, html, "#finding-1")
    assert seen["width"] == 1280 and seen["scroll"] <= 1280, seen  # nothing wider than the window
    assert seen["box"] is not None and seen["box"]["bottom"] <= FIRST_SCREEN, seen
    assert "Waiting for data" in seen["seen"] and f"num_workers={max(1, int(config.cpus_available))}" in seen["seen"]
    assert seen["last"] <= 1280 and seen["nav"] < 200, seen  # every navigation link inside the window
    cli = otelprof("report", str(run), "-q", "-o", str(tmp_path / "cli.html"))
    assert f"diagnosis: {d.headline}" in cli.stdout.splitlines()
    # check leads with the same diagnosis
    text = otelprof("check", str(run))
    assert text.stdout.startswith("DIAGNOSIS: ") and " 1. Waiting for data: " in text.stdout
    assert text.stdout.index("Waiting for data") < text.stdout.index("CHECK ")
    as_json = json.loads(otelprof("check", str(run), "--json").stdout)
    assert as_json["diagnosis"] == json.loads(json.dumps(diagnosis_dict(d)))
    assert as_json["diagnosis"]["findings"][0]["key"] == "input-bound" and as_json["checks"]


def test_a_steady_run_says_it_is_healthy_and_where_its_time_goes(tmp_path: Path) -> None:
    run = steady_run(tmp_path)
    unjudged = build_report(load(run), checks=False).diagnosis  # the analyses alone say so, and say that
    assert unjudged.healthy and "the checks were not evaluated" in unjudged.headline
    report = build_report(load(run))
    d = report.diagnosis
    assert d.healthy and not d.findings, d
    assert d.headline.startswith("Healthy")
    # the breakdown in one line, from the steps' own regions: 2 ms data, 40 ms forward, 50 ms backward per step
    mean_step = sum(0.1 + 0.002 * (n % 5) for n in range(200)) / 200
    assert f"backward {0.05 / mean_step * 100:.1f} %" in d.time_split
    assert f"forward {0.04 / mean_step * 100:.1f} %" in d.time_split
    html = render(report)
    (tmp_path / "report.html").write_text(html, encoding="utf-8")
    seen = first_screen(tmp_path, html, "p.headline")
    assert seen["box"]["bottom"] <= FIRST_SCREEN and "Healthy" in seen["seen"], seen
    # sections whose checks found nothing fold to one line each: the page stays short
    folded = re.findall(r'<section id="([^"]+)"><details class="fold">', html)
    assert {"steps", "dataloader", "gpu-memory"} <= set(folded), folded
    assert all(d.section(a) is None or d.section(a).status != "finding" for a in folded)  # type: ignore[union-attr]


def test_findings_are_ranked_by_cost_causes_before_symptoms(tmp_path: Path) -> None:
    """A run whose steps wait for data 60 % of the time and whose stalls make outlier steps: the data loader (the
    cause) leads, the outliers (its symptom) follow, each cost from the steps themselves."""
    run = tmp_path / "stalls"
    steps = []
    t = T0 + 5
    waits = []
    for n in range(300):
        stall = n % 25 == 24
        wait = 1.2 if stall else 0.06
        d = wait + 0.04
        waits.append((wait, d))
        steps.append(step_line("train", n, t, d, [("dataloader", 0.0, wait, 0), ("forward", wait, 0.04, 0)]))
        t += d
    life = {"process_start": T0, "first_step_start": T0 + 5, "last_step_end": t, "shutdown": t + 1}
    write_rank(run, 0, manifest(lifecycle=life, run_id="stalls"), steps, small_samples(T0 + 10, gpus=False))
    # windows short enough for this 43 s run: StepOutliers fires at more evaluations than InputBound
    config = with_overrides(MixinConfig(), ["input_bound_window=20s", "input_bound_for=20s",
                                            "step_outlier_n_outliers=2", "step_outlier_min_steps=50"])
    report = build_report(load(run), config)
    d = report.diagnosis
    fired = [(r.alert, r.firing_evaluations) for r in report.rules.rows if r.triggered]
    assert [a for a, _ in fired] == ["OtelprofStepOutliers", "OtelprofInputBound"], fired  # most often first
    assert [f.checks for f in d.findings[:2]] == [("OtelprofInputBound",), ("OtelprofStepOutliers",)]
    html = render(report)
    assert "(causes first): OtelprofInputBound, OtelprofStepOutliers." in html
    assert html.index("<b>OtelprofInputBound</b>") < html.index("<b>OtelprofStepOutliers</b>")  # the table too
    keys = [f.key for f in d.findings]
    assert keys[:2] == ["input-bound", "outliers"], keys
    share = sum(w for w, _ in waits) / sum(x for _, x in waits)
    assert d.findings[0].cost == pytest.approx(share, rel=1e-6)
    outliers = d.findings[1]
    median = 0.1
    assert outliers.cost == pytest.approx(12 * (1.24 - median) / sum(x for _, x in waits), rel=1e-6)
    assert "12 outlier steps" in outliers.cost_text and math.isfinite(outliers.cost or math.nan)
    # its action from the outlier steps' own regions: the data loader took 1.14 s more in them
    assert f"In the outlier steps dataloader took 1.14 s more than in the others, of the {1.24 - median:.3g} s " \
           "each lost: the data loader stalls" in outliers.action
    assert "--from-step 24 --to-step 24" in outliers.action


def test_data_loader_wait_histogram_keeps_its_bulk_apart_from_a_few_stalls() -> None:
    """1,000 waits of 10 to 20 ms and 5 stalls of 1 s: over the whole range every wait but the stalls falls in the
    first of 50 bins (one bar); the histogram spans up to the 99th percentile instead, the stalls in its last bin."""
    waits = [0.01 + 0.01 * (i % 100) / 100 for i in range(1000)] + [1.0] * 5
    assert sum(1 for c in Histogram.of(waits, 50).counts if c) == 2  # the defect: one bar and the stalls
    histogram, clipped = wait_histogram(waits)
    assert clipped == 5 + sum(1 for w in waits if quantile(sorted(waits), 0.99) < w < 1.0)
    assert histogram.total == len(waits) and sum(1 for c in histogram.counts if c) > 40
    assert histogram.edges[-1] == pytest.approx(quantile(sorted(waits), 0.99))
    steady = [0.01 + 0.001 * i for i in range(100)]  # no far tail: the whole range, nothing clipped
    assert wait_histogram(steady) == (Histogram.of(steady, 50), 0)


def test_an_axis_of_non_negative_values_has_no_negative_tick() -> None:
    """Bytes held over a window (a flat curve, and one starting at 0) and step times: ticks from 0 up."""
    for ys in ([4e6] * 5, [0.0, 1e6, 3e6, 2e6, 0.0], [0.2, 0.25, 0.21]):
        xs = [float(i) for i in range(len(ys))]
        chart = svg.xy([("rank 0", xs, ys, ys, ys)], "allocated", size, str)
        ticks = re.findall(r'class="tick">([^<]*)<', chart)
        assert ticks and not any(t.startswith("-") for t in ticks), ticks
    chart = svg.xy([("loss", [0.0, 1.0], [-1.0, 2.0], [-1.0, 2.0], [-1.0, 2.0])], "loss", str, str)
    assert any(t.startswith("-") for t in re.findall(r'class="tick">([^<]*)<', chart))  # negative data keeps them
