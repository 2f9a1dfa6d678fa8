"""The static dashboard: an index page with the nights and a trend chart per (metric, deployment),
and a page per night (gate result, versions, points, links to its report and figures).

<out>/index.html
<out>/nights/<night-id>.html
<out>/artifacts/<night-id>/...      copies of what the store holds for the night

Everything is local files: no script, no font or style from elsewhere, so the folder works from
file://, from a CI artifact, or behind any static web server.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from harness.io import atomic_write_text
from harness.nightly.changepoint import ChangePoint, grouped, history_change_points
from harness.nightly.gate import GateResult, gate_history
from harness.nightly.gate_markdown import number, regression_report
from harness.nightly.night_record import NightRecord
from harness.nightly.store import NightStore
from harness.nightly.svg import Marker, Series, TrendChart, render
from harness.nightly.thresholds import METRIC_BETTER, NightlySettings
from harness.summary import COLUMNS

_UNITS = {c.name: c.unit for c in COLUMNS}
_CSS = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; } th { background: #f3f3f3; }
td.num { text-align: right; }
.pass { color: #1e7b34; font-weight: bold; } .regression { color: #c0392b; font-weight: bold; }
.not_comparable { color: #b8860b; font-weight: bold; }
.chart-title { font-size: 13px; font-weight: bold; fill: #222; } .tick { font-size: 11px; fill: #444; }
.sim { background: #c0392b; color: white; padding: 4px 10px; font-weight: bold; display: inline-block; }
pre { background: #f6f6f6; padding: 10px; overflow-x: auto; font-size: 12px; }
svg { display: block; margin: 6px 0 18px; }
"""


@dataclass(frozen=True)
class DashboardResult:
    index: Path
    night_pages: int
    charts: int
    total_bytes: int
    warnings: list[str] = field(default_factory=list)


def _page(title: str, body: list[str]) -> str:
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>", *body,
                      "</body></html>"]) + "\n"


def _outcome(result: GateResult) -> str:
    text = {"pass": "pass", "regression": "regression", "not_comparable": "not comparable"}[result.outcome]
    return f'<span class="{result.outcome}">{text}</span>'


def _copy_artifacts(store: NightStore, night: NightRecord, out_dir: Path, warnings: list[str]) -> None:
    for rel in [night.report_path, *night.figure_paths]:
        if not rel:
            continue
        source = store.root / rel
        if not source.is_file():
            warnings.append(f"warning: {source}: named by night {night.night_id} but missing; not linked")
            continue
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def _x_labels(nights: Sequence[NightRecord]) -> list[str]:
    """The date of each night; with the time too where two nights share a date (a re-run), and the
    night ids where two share the minute too (a test, a replay)."""
    starts = [(n.started_at or n.night_id) for n in nights]
    dates = [s[:10] for s in starts]
    if len(set(dates)) == len(dates):
        return dates
    times = [s[5:16].replace("T", " ") if len(s) >= 16 and s[10] == "T" else s for s in starts]
    return times if len(set(times)) == len(times) else [n.night_id for n in nights]  # same minute: the ids


def _changes_text(changes: Sequence[ChangePoint], short: bool = False) -> str:
    """'2 change(s) in 24 series': a change seen at every point and metric of an arm is one change."""
    groups = len(grouped(changes))
    if short:
        return f"{groups} ({len(changes)} series)"
    return f"{groups} change point(s) in {len(changes)} series" if changes else "no change point"


def _charts(nights: Sequence[NightRecord], results: Sequence[GateResult], changes: Sequence[ChangePoint],
            metrics: Sequence[str]) -> list[TrendChart]:
    ids = [n.night_id for n in nights]
    labels = _x_labels(nights)
    deployments = sorted({d for n in nights for d, _ in n.points()})
    charts = []
    for metric in metrics:
        for dep in deployments:
            parallels = sorted({p for n in nights for d, p in n.points() if d == dep})
            series = [Series(f"c{p}", [n.value(dep, p, metric) for n in nights]) for p in parallels]
            flagged = {(f"c{f.concurrency}", i) for i, r in enumerate(results) for f in r.findings
                       if f.deployment == dep and f.metric == metric and f.concurrency is not None}
            markers = [Marker(ids.index(c.night_id), f"c{c.concurrency}: {c.text}", c.worse) for c in changes
                       if c.deployment == dep and c.metric == metric]
            unit = _UNITS.get(metric, "")
            charts.append(TrendChart(f"{metric}{f' ({unit})' if unit else ''}: {dep}", metric, dep, ids,
                                     labels,
                                     [f"nights/{i}.html" for i in ids], series, flagged, markers))
    return charts


def _index(nights: Sequence[NightRecord], results: Sequence[GateResult], changes: Sequence[ChangePoint],
           charts: Sequence[TrendChart], metrics: Sequence[str]) -> str:
    body = ["<h1>Nightly benchmark history</h1>"]
    if any(n.simulated for n in nights):
        body.append('<p class="sim">Simulated-engine nights are shown: they are not GPU measurements.</p>')
    if nights:
        last, result = nights[-1], results[-1]
        body.append(f"<p>Latest night <a href=\"nights/{escape(last.night_id)}.html\">{escape(last.night_id)}"
                    f"</a>: {_outcome(result)}, {len(result.findings)} finding(s). {len(nights)} night(s) in "
                    f"the history; {_changes_text(changes)}.</p>")
    else:
        body.append("<p>The history is empty.</p>")
    body += ["<h2>Nights</h2>", "<table><tr><th>night</th><th>started</th><th>gate</th><th>findings</th>"
             "<th>change points from this night</th><th>report</th></tr>"]
    starts = {c.night_id for c in changes}
    for night, result in reversed(list(zip(nights, results, strict=True))):
        report = f'<a href="{escape(night.report_path)}">report</a>' if night.report_path else "-"
        count = _changes_text([c for c in changes if c.night_id == night.night_id], short=True)
        body.append(f'<tr><td><a href="nights/{escape(night.night_id)}.html">{escape(night.night_id)}</a></td>'
                    f"<td>{escape(night.started_at or '-')}</td><td>{_outcome(result)}</td>"
                    f'<td class="num">{len(result.findings)}</td>'
                    f'<td class="num">{count if night.night_id in starts else "-"}</td><td>{report}</td></tr>')
    body.append("</table>")
    if changes:
        body += ["<h2>Change points</h2>", "<ul>"]
        for group in grouped(changes):
            each = "".join(f"<li>{escape(c.short)}</li>" for c in group.members)
            body.append(f"<li>{escape(group.text)}<details><summary>{len(group.members)} series</summary>"
                        f"<ul>{each}</ul></details></li>")
        body.append("</ul>")
    for metric in metrics:
        better = METRIC_BETTER.get(metric)
        body.append(f"<h2>{escape(metric)}</h2>" + (f"<p>{better} is better</p>" if better else ""))
        body += [render(c) for c in charts if c.metric == metric]
    return _page("Nightly benchmark history", body)


def _night_page(night: NightRecord, result: GateResult, changes: Sequence[ChangePoint]) -> str:
    up = "../"
    body = ['<p><a href="../index.html">all nights</a></p>', f"<h1>Night {escape(night.night_id)}</h1>"]
    if night.simulated:
        body.append('<p class="sim">SIMULATED ENGINE: not GPU measurements</p>')
    body.append(f"<p>Gate: {_outcome(result)}. Baseline nights: "
                + (", ".join(f'<a href="{escape(i)}.html">{escape(i)}</a>' for i in result.baseline_nights)
                   or "none") + ".</p>")
    links = []
    if night.report_path:
        links.append(f'<a href="{up}{escape(night.report_path)}">report</a>')
    links += [f'<a href="{up}{escape(p)}">{escape(Path(p).name)}</a>' for p in night.figure_paths]
    if links:
        body.append("<p>Files: " + " · ".join(links) + "</p>")
    mine = [c for c in changes if c.night_id == night.night_id]
    report = regression_report(result, night, mine)
    body += ["<h2>Report</h2>", f"<pre>{escape(report)}</pre>", "<h2>Points</h2>",
             "<table><tr><th>deployment</th><th>c</th><th>status</th>"
             + "".join(f"<th>{escape(m)}</th>" for m in METRIC_BETTER) + "</tr>"]
    for dep, concurrency in night.points():
        row = night.row(dep, concurrency)
        cells = "".join(f'<td class="num">{number(getattr(row, m, None))}</td>' for m in METRIC_BETTER)
        body.append(f"<tr><td>{escape(dep)}</td><td class=\"num\">{concurrency}</td>"
                    f"<td>{escape(str(row.status if row else '-'))}</td>{cells}</tr>")
    body.append("</table>")
    body += [f'<img src="{up}{escape(p)}" alt="{escape(Path(p).name)}" style="max-width:100%">'
             for p in night.figure_paths if p.endswith((".svg", ".png"))]
    return _page(f"Night {night.night_id}", body)


def build_dashboard(store: NightStore | Path | str, out_dir: Path | str, settings: NightlySettings | None = None,
                    metrics: Sequence[str] = tuple(METRIC_BETTER)) -> DashboardResult:
    """Write the dashboard of every night in `store` into `out_dir`."""
    store = store if isinstance(store, NightStore) else NightStore(store)
    out_dir = Path(out_dir)
    history = store.load()
    warnings = list(history.warnings)
    nights = history.nights
    results = gate_history(nights, settings)
    changes = history_change_points(nights, metrics)
    charts = _charts(nights, results, changes, metrics)
    for night in nights:
        _copy_artifacts(store, night, out_dir, warnings)
    pages = {out_dir / "index.html": _index(nights, results, changes, charts, metrics)}
    for night, result in zip(nights, results, strict=True):
        pages[out_dir / "nights" / f"{night.night_id}.html"] = _night_page(night, result, changes)
    for path, text in pages.items():
        atomic_write_text(path, text)
    total = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    return DashboardResult(out_dir / "index.html", len(nights), len(charts), total, warnings)
