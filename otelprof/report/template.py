"""The report page's frame and stylesheet (inline: the file must open offline, with no CDN)."""

from __future__ import annotations

STYLE = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dee7; --bg: #ffffff; --soft: #f4f6fa;
        --warn: #b45309; --bad: #b91c1c; --good: #15803d; --accent: #4e79a7; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); }
header { padding: 18px 28px; background: #1f2a44; color: #fff; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header .meta { color: #c9d2e3; font-size: 13px; }
nav { position: sticky; top: 0; z-index: 2; background: var(--soft); border-bottom: 1px solid var(--line);
      padding: 6px 28px; font-size: 13px; display: flex; flex-wrap: wrap; gap: 2px 12px; }
nav a { color: var(--accent); text-decoration: none; white-space: nowrap; }
main { padding: 8px 28px 40px; max-width: 1240px; }
section { border-bottom: 1px solid var(--line); padding: 10px 0 18px; }
h2 { font-size: 19px; margin: 18px 0 8px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
p { margin: 6px 0; max-width: 980px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
td.l, th.l { text-align: left; }
td.wide { text-align: left; max-width: 420px; }
tr.fired td { background: #fff4e5; }
.rules table { width: 100%; table-layout: fixed; }
.rules td { font-size: 12px; overflow-wrap: anywhere; }
.rules th:nth-child(1) { width: 15%; } .rules th:nth-child(2) { width: 6%; } .rules th:nth-child(3) { width: 22%; }
.rules th:nth-child(4) { width: 27%; } .rules th:nth-child(5) { width: 6%; } .rules th:nth-child(6) { width: 7%; }
.rules th:nth-child(7) { width: 7%; } .rules th:nth-child(8) { width: 10%; }
.muted { color: var(--muted); }
.note { background: var(--soft); border-left: 4px solid var(--accent); padding: 6px 10px; margin: 8px 0;
        max-width: 980px; }
.warn { border-left-color: var(--warn); }
.bad { border-left-color: var(--bad); }
.good { border-left-color: var(--good); }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; color: #fff; }
.badge.fired { background: var(--warn); }
.badge.ok { background: var(--good); }
.badge.nodata { background: #8a93a6; }
p.nodata { color: var(--muted); font-size: 13px; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
figure { margin: 6px 0; }
figcaption { font-size: 12px; color: var(--muted); }
svg.chart { background: #fff; overflow: visible; }
svg.chart .lbl { font-size: 12px; fill: var(--fg); }
svg.chart .tick { font-size: 10px; fill: var(--muted); }
svg.chart .axis { stroke: #8a93a6; stroke-width: 1; }
svg.chart .grid { stroke: #e7eaf0; stroke-width: 1; }
svg.chart .whisker { stroke: #555; stroke-width: 1.2; }
code { background: var(--soft); padding: 0 3px; border-radius: 3px; }
footer { padding: 12px 28px 30px; color: var(--muted); font-size: 12px; }
p.headline { font-size: 17px; font-weight: 600; border-left: 5px solid var(--accent); padding: 6px 12px;
             background: var(--soft); }
p.headline.good { border-left-color: var(--good); }
p.headline.warn { border-left-color: var(--warn); }
ol.findings { margin: 8px 0; padding-left: 24px; max-width: 1100px; }
li.finding { margin: 0 0 10px; }
li.finding .cost { font-size: 15px; }
li.finding .action { margin: 2px 0; }
li.finding .evidence { font-size: 12px; }
details.fold > summary { cursor: pointer; list-style-position: outside; }
details.fold > summary h2 { display: inline; margin: 0 8px 0 0; font-size: 17px; }
details.fold > summary .foldline { color: var(--muted); font-size: 13px; }
details.fold[open] > summary { margin-bottom: 8px; }
section:has(> details.fold) { padding: 8px 0; }
svg.chart { max-width: 100%; height: auto; }
.rules, table { max-width: 100%; }
@media print { nav { display: none; } details.fold > *:not(summary) { display: block; } }
"""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="otelprof {version}">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<header><h1>{heading}</h1><div class="meta">{meta}</div></header>
<nav>{nav}</nav>
<main>
{sections}
</main>
<footer>{footer}</footer>
</body>
</html>
"""
