"""The HTML report of one simulation run: a single self-contained page.

This module owns how a run looks: per share a stacked area chart of own / lent / borrowed GPUs over
time (with the share's capacity as a line), a Gantt of the attempts on each node with pre-emptions
and node losses marked, and a table of wait times per share. plotly.js is embedded inline from the
installed plotly wheel, so the page needs no network (and names no CDN). Big runs are downsampled:
the area charts are time-weighted averages over at most `MAX_POINTS` intervals and the Gantt shows
whole nodes, in order, up to `MAX_BARS` bars, so that the page stays a few MB (most of it plotly.js).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from quotas.engine import scenario as sc
from quotas.engine.timeline import Timeline, percentile

MAX_POINTS = 1200
MAX_BARS = 4000

METRICS = (  # stacking order, bottom to top: own and lent are within capacity, borrowed above it
    ("own", "own", "#3b6fb6"),
    ("lent", "lent to others", "#7fbf7b"),
    ("borrowed", "borrowed", "#f28e2b"),
)
SHARE_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"


def render_report(scenario: sc.Scenario, result: Any, timeline: Timeline) -> str:
    """The report page. `result` is a `SimResult` or its result JSON (`SimResult.to_dict()`)."""
    data = result.to_dict() if hasattr(result, "to_dict") else result
    end = max(1, data["cluster"]["makespan_s"], timeline.end)
    unit, scale = ("h", 3600) if end > 2 * 3600 else ("s", 1)
    usage = _usage_figure(scenario, timeline, end, unit, scale)
    gantt, gantt_note = _gantt_figure(scenario, data, end, unit, scale)
    figures = json.dumps({"usage": usage, "gantt": gantt}, separators=(",", ":"))
    return _PAGE.format(
        title=html.escape(_title(scenario)),
        description=html.escape(scenario.description or ""),
        cards=_cards(scenario, data),
        gantt_note=html.escape(gantt_note),
        usage_height=usage["layout"]["height"],
        gantt_height=gantt["layout"]["height"],
        wait_table=_wait_table(scenario, data) + _groups_table(scenario, data),
        forecast_section=_forecast_section(data),
        plotlyjs=_plotlyjs(),
        figures=figures.replace("</", "<\\/"),
        font=FONT,
    )


def _plotlyjs() -> str:
    from plotly.offline import get_plotlyjs

    # The bundle's defaults for map tiles and topojson point at CDNs; no chart here uses them, and
    # with them gone the page names no CDN at all.
    js = get_plotlyjs()
    for cdn in ("https://cdn.plot.ly/", "https://cdn.jsdelivr.net/"):
        js = js.replace(cdn, "./")
    return js.replace("</script", "<\\/script")


def _title(scenario: sc.Scenario) -> str:
    gpus = sum(n.gpus for n in scenario.nodes)
    return f"gpuquota simulation: {len(scenario.jobs):,} jobs, {len(scenario.shares)} shares, {gpus:,} GPUs"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


# -- area charts ------------------------------------------------------------------------------------


def _grid(timeline: Timeline, keys: Sequence[tuple[str, str, str]], end: int) -> tuple[list[int], bool]:
    """Times to plot at: every change point if few enough (exact), else evenly spaced bins."""
    points = sorted({t for k in keys for t in timeline.series[k][0] if t < end} | {0})
    if len(points) <= MAX_POINTS:
        return points + [end], True
    return [round(end * i / MAX_POINTS) for i in range(MAX_POINTS + 1)], False


def _sample(times: Sequence[int], values: Sequence[float], grid: Sequence[int], exact: bool) -> list[float]:
    """The step function (times, values) on each grid interval: its value there, or its mean."""
    out, i, n = [], 0, len(times)
    for lo, hi in zip(grid, grid[1:], strict=False):
        while i + 1 < n and times[i + 1] <= lo:
            i += 1
        current = values[i] if n and times[i] <= lo else 0.0
        if exact or hi <= lo:
            out.append(current)
            continue
        area, t, j = 0.0, lo, i
        while j + 1 < n and times[j + 1] < hi:
            area += current * (times[j + 1] - t)
            t, j = times[j + 1], j + 1
            current = values[j]
        area += current * (hi - t)
        out.append(area / (hi - lo))
    out.append(out[-1] if out else 0.0)
    return [round(v, 2) for v in out]


def _summed(timeline: Timeline, share: str, metric: str, grid: Sequence[int], exact: bool) -> list[float]:
    total = [0.0] * len(grid)
    for key in timeline.keys(share=share, metric=metric):
        times, values = timeline.series[key]
        for i, v in enumerate(_sample(times, values, grid, exact)):
            total[i] += v
    return total


def _usage_figure(
    scenario: sc.Scenario, timeline: Timeline, end: int, unit: str, scale: int
) -> dict[str, Any]:
    shares = [s.name for s in scenario.shares]
    keys = [k for k in timeline.series if k[0] in shares and k[2] != "capacity"]
    grid, exact = _grid(timeline, keys or list(timeline.series), end)
    x = [round(t / scale, 4) for t in grid]
    n = max(1, len(shares))
    gap = 0.06 / n if n > 1 else 0
    height = 60 + 190 * n
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "height": height,
        "margin": {"l": 70, "r": 20, "t": 40, "b": 50},
        "font": {"family": FONT, "size": 12},
        "hovermode": "x unified",
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "yref": "container"},
        "plot_bgcolor": "#fbfbfd",
        "annotations": [],
    }
    for row, share in enumerate(shares):
        axis = "" if row == 0 else str(row + 1)
        top = 1 - row / n
        layout[f"yaxis{axis}"] = {
            "domain": [max(0, top - 1 / n + gap), top - gap / 2],
            "title": {"text": "GPUs"},
            "rangemode": "tozero",
            "gridcolor": "#e4e4ea",
        }
        layout[f"xaxis{axis}"] = {
            "anchor": f"y{axis}",
            "matches": "x" if row else None,
            "showticklabels": row == n - 1,
            "title": {"text": f"virtual time ({unit})"} if row == n - 1 else None,
            "gridcolor": "#e4e4ea",
        }
        layout["annotations"].append(
            {
                "text": f"<b>{html.escape(share)}</b>",
                "xref": "paper",
                "yref": f"y{axis} domain",
                "x": 0,
                "y": 1,
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
            }
        )
        for metric, label, colour in METRICS:
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": label,
                    "legendgroup": metric,
                    "showlegend": row == 0,
                    "x": x,
                    "y": _summed(timeline, share, metric, grid, exact),
                    "stackgroup": share,
                    "line": {"width": 0.5, "color": colour, "shape": "hv" if exact else "linear"},
                    "fillcolor": colour,
                    "xaxis": f"x{axis}",
                    "yaxis": f"y{axis}",
                    "hovertemplate": f"{label}: %{{y:.1f}}<extra>{html.escape(share)}</extra>",
                }
            )
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "own capacity",
                "legendgroup": "capacity",
                "showlegend": row == 0,
                "x": x,
                "y": _summed(timeline, share, "capacity", grid, True),
                "line": {"color": "#222", "dash": "dash", "width": 1.2, "shape": "hv"},
                "xaxis": f"x{axis}",
                "yaxis": f"y{axis}",
                "hovertemplate": f"capacity: %{{y}}<extra>{html.escape(share)}</extra>",
            }
        )
    for key in list(layout):
        if isinstance(layout[key], dict):
            layout[key] = {k: v for k, v in layout[key].items() if v is not None}
    return {"data": data, "layout": layout}


# -- Gantt ------------------------------------------------------------------------------------------


def _lanes(free_at: list[int], k: int, start: int) -> list[int]:
    """Pick k GPU lanes of a node free at `start`: the first contiguous run if any, else the lowest."""
    free = [i for i, t in enumerate(free_at) if t <= start]
    for i in range(len(free) - k + 1):
        if free[i + k - 1] - free[i] == k - 1:
            return free[i : i + k]
    if len(free) >= k:
        return free[:k]
    return sorted(range(len(free_at)), key=lambda i: (free_at[i], i))[:k]


def _runs(lanes: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs of sorted lane numbers as (first, count)."""
    out: list[tuple[int, int]] = []
    for lane in lanes:
        if out and out[-1][0] + out[-1][1] == lane:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((lane, 1))
    return out


def _gantt_figure(
    scenario: sc.Scenario, data: Mapping[str, Any], end: int, unit: str, scale: int
) -> tuple[dict[str, Any], str]:
    jobs = {j.id: j for j in scenario.jobs}
    node_gpus = {n.name: n.gpus for n in scenario.nodes}
    colours = {s.name: SHARE_COLOURS[i % len(SHARE_COLOURS)] for i, s in enumerate(scenario.shares)}
    per_node: dict[str, list[tuple[dict[str, Any], str, int]]] = {n.name: [] for n in scenario.nodes}
    for job_id, job in data["jobs"].items():
        for number, attempt in enumerate(job["attempts"], start=1):
            for node in attempt["nodes"]:
                per_node[node].append((attempt, job_id, number))

    shown, bars = [], 0
    for node in per_node:
        if shown and bars + len(per_node[node]) > MAX_BARS:
            break
        shown.append(node)
        bars += len(per_node[node])
    note = ""
    if len(shown) < len(per_node):
        note = (
            f"Showing the first {len(shown)} of {len(per_node)} nodes ({bars:,} of "
            f"{sum(len(v) for v in per_node.values()):,} attempt bars) to keep the page small."
        )

    traces: dict[str, dict[str, Any]] = {}
    marks = {
        "PREEMPTED": ("pre-empted", "x", "#c0392b"),
        "FAILED": ("failed", "x-thin", "#000"),
        "NODE_LOST": ("node lost", "star", "#8e44ad"),
    }
    marker_traces = {
        outcome: {"x": [], "y": [], "text": [], "name": label, "symbol": symbol, "colour": colour}
        for outcome, (label, symbol, colour) in marks.items()
    }
    ticks, labels, base = [], [], 0.0
    for node in shown:
        size = node_gpus[node]
        free_at = [0] * size
        for attempt, job_id, number in sorted(per_node[node], key=lambda a: (a[0]["start"], a[1])):
            spec = jobs[job_id]
            k = min(size, spec.gpus if len(attempt["nodes"]) == 1 else size)
            stop = end if attempt["end"] is None else attempt["end"]
            lanes = _lanes(free_at, k, attempt["start"])
            for lane in lanes:
                free_at[lane] = stop
            trace = traces.setdefault(
                spec.share,
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": spec.share,
                    "x": [],
                    "y": [],
                    "base": [],
                    "width": [],
                    "hovertext": [],
                    "marker": {"color": colours[spec.share], "line": {"width": 0.4, "color": "#fff"}},
                    "hoverinfo": "text",
                },
            )
            outcome = attempt["outcome"] or "running at the cut"
            hover = (
                f"<b>{html.escape(job_id)}</b> ({html.escape(spec.share)}) attempt {number}<br>"
                f"{attempt['start']:,}–{stop:,} s, {spec.gpus} GPU{'s' if spec.gpus > 1 else ''}"
                f"{', borrowed' if attempt['borrowed'] else ''}<br>{outcome}"
            )
            if attempt.get("preempted_by"):
                hover += f" for {html.escape(attempt['preempted_by'])} ({attempt.get('preemption_reason')})"
            for first, count in _runs(lanes):
                trace["x"].append(round((stop - attempt["start"]) / scale, 4))
                trace["base"].append(round(attempt["start"] / scale, 4))
                trace["y"].append(base + first + count / 2)
                trace["width"].append(count * 0.9)
                trace["hovertext"].append(hover)
            if attempt["outcome"] in marker_traces and attempt["end"] is not None:
                mark = marker_traces[attempt["outcome"]]
                mark["x"].append(round(stop / scale, 4))
                mark["y"].append(base + lanes[0] + len(lanes) / 2)
                mark["text"].append(hover)
        ticks.append(base + size / 2)
        labels.append(node)
        base += size + 1

    data_out = list(traces.values())
    for mark in marker_traces.values():
        if mark["x"]:
            data_out.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": mark["name"],
                    "x": mark["x"],
                    "y": mark["y"],
                    "hovertext": mark["text"],
                    "hoverinfo": "text",
                    "marker": {
                        "symbol": mark["symbol"],
                        "size": 9,
                        "color": mark["colour"],
                        "line": {"width": 1.5, "color": mark["colour"]},
                    },
                }
            )
    step = max(1, len(ticks) // 40)
    layout = {
        "height": min(1400, max(260, 80 + 14 * base)),
        "barmode": "overlay",
        "bargap": 0,
        "margin": {"l": 90, "r": 20, "t": 30, "b": 50},
        "font": {"family": FONT, "size": 12},
        "plot_bgcolor": "#fbfbfd",
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "yref": "container"},
        "xaxis": {
            "title": {"text": f"virtual time ({unit})"},
            "range": [0, end / scale],
            "gridcolor": "#e4e4ea",
        },
        "yaxis": {
            "title": {"text": "node (one lane per GPU)"},
            "tickvals": ticks[::step],
            "ticktext": labels[::step],
            "autorange": "reversed",
            "showgrid": False,
            "zeroline": False,
        },
    }
    return {"data": data_out, "layout": layout}, note


# -- tables -----------------------------------------------------------------------------------------


def _cards(scenario: sc.Scenario, data: Mapping[str, Any]) -> str:
    cluster = data["cluster"]
    jobs = data["jobs"].values()
    finals: dict[str, int] = {}
    for job in jobs:
        finals[job["final"]] = finals.get(job["final"], 0) + 1
    cards = [
        ("utilisation", f"{cluster['utilisation']:.1%}"),
        ("makespan", _duration(cluster["makespan_s"])),
        ("pre-emptions", f"{sum(j['preemptions'] for j in jobs):,}"),
        ("lost GPU-hours", f"{cluster['lost_gpu_seconds'] / 3600:,.1f}"),
        ("policy passes", f"{cluster['passes']:,}"),
        ("jobs", ", ".join(f"{n:,} {state.lower()}" for state, n in sorted(finals.items())) or "none"),
    ]
    return "\n".join(
        f'<div class="card"><div class="label">{html.escape(k)}</div><div class="value">{html.escape(v)}</div></div>'
        for k, v in cards
    )


def _forecast_section(data: Mapping[str, Any]) -> str:
    """With `--forecast`: how far the ETA told at submit was from the actual start, as a distribution
    (error buckets per ETA kind) and the figures of `cluster.forecast_error`."""
    err = data["cluster"].get("forecast_error")
    if not err:
        return ""
    edges = [0, 60, 300, 900, 3600, 4 * 3600, 24 * 3600]
    labels = ["< 1 min", "1-5 min", "5-15 min", "15-60 min", "1-4 h", "4-24 h", "> 1 day"]
    counts: dict[str, list[int]] = {}
    for job in data["jobs"].values():
        f = job.get("forecast_at_submit")
        if not f or f["eta"] is None or job["first_start"] is None:
            continue
        e = abs(job["first_start"] - f["eta"])
        row = counts.setdefault(f["kind"], [0] * len(labels))
        row[sum(1 for edge in edges[1:] if e >= edge)] += 1
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    body = "".join(
        f"<tr><th>{html.escape(kind)}</th>" + "".join(f"<td>{n:,}</td>" for n in row) + "</tr>"
        for kind, row in sorted(counts.items())
    )

    def figures(e: Mapping[str, Any], who: str) -> str:
        if not e.get("n"):
            return f"no {who}"
        within = "–" if e["within_25pct"] is None else f"{e['within_25pct']:.1%}"
        text = (
            f"{e['n']:,} {who}: median error {_duration(e['median_abs_s'])}, p90 {_duration(e['p90_abs_s'])}, "
            f"{within} within ±25% of the forecast wait (or 60 s)"
        )
        if e.get("range_coverage") is not None:
            text += (
                f"; {e['range_coverage']:.1%} started within their likely range "
                f"(median width {_duration(e['range_width_median_s'])})"
            )
        return text

    summary = (
        f"{figures(err, 'jobs with an ETA and a start')}. Of them, "
        f"{figures(err.get('waited') or {}, 'waited more than a minute')}. "
        f"Bound ETAs missed: {err.get('bound_started_late', 0):,}."
    )
    return (
        "<h2>ETA at submit against the actual start</h2>\n"
        f'<p class="note">{html.escape(summary)}</p>\n'
        f"<table><thead><tr><th>ETA kind</th>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def _wait_table(scenario: sc.Scenario, data: Mapping[str, Any]) -> str:
    share_of = {j.id: j.share for j in scenario.jobs}
    waits: dict[str, list[int]] = {s.name: [] for s in scenario.shares}
    counts: dict[str, int] = {s.name: 0 for s in scenario.shares}
    for job_id, job in data["jobs"].items():
        share = share_of[job_id]
        counts[share] += 1
        if job["wait_s"] is not None:
            waits[share].append(job["wait_s"])
    head = (
        "<tr><th>share</th><th>strategy</th><th>capacity</th><th>jobs</th><th>never started</th>"
        "<th>mean wait</th><th>median wait</th><th>p95 wait</th><th>max wait</th><th>pre-empted jobs</th>"
        "<th>GPU-h own</th><th>GPU-h borrowed</th><th>GPU-h lent</th>"
        "<th>GPU-h lost: reclaim</th><th>GPU-h lost: priority</th><th>GPU-h lost: node lost</th>"
        + ("<th>GPU-h lost: fair share</th>" if _fair(scenario, data) else "")
        + "</tr>"
    )
    rows = []
    for share in scenario.shares:
        w = sorted(waits[share.name])
        stats = data["shares"].get(share.name, {})
        capacity = ", ".join(f"{n} {t}" for t, n in share.capacity.items()) or "–"
        cells = [
            f"<th>{html.escape(share.name)}</th>",
            f"<td>{html.escape(share.strategy)}</td>",
            f"<td>{html.escape(capacity)}</td>",
            f"<td>{counts[share.name]:,}</td>",
            f"<td>{counts[share.name] - len(w):,}</td>",
            f"<td>{_duration(stats.get('mean_wait_s'))}</td>",
            f"<td>{_duration(percentile(w, 50))}</td>",
            f"<td>{_duration(stats.get('p95_wait_s'))}</td>",
            f"<td>{_duration(w[-1] if w else None)}</td>",
            f"<td>{stats.get('preempted_jobs', 0):,}</td>",
        ]
        cells += [
            f"<td>{stats.get(f'gpu_seconds_{m}', 0) / 3600:,.1f}</td>" for m in ("own", "borrowed", "lent")
        ]
        # Work thrown away by pre-emption and lost nodes (since each attempt's safe point), by cause.
        lost = stats.get("lost_gpu_seconds") or {}
        causes = ("reclaim", "priority", "node_lost") + (("fair_share",) if _fair(scenario, data) else ())
        cells += [f"<td>{lost.get(c, 0) / 3600:,.2f}</td>" for c in causes]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="wait-table"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _fair(scenario: sc.Scenario, data: Mapping[str, Any]) -> bool:
    """Whether the table shows the work lost to fair reclaim (rule 11): it was on, or some was lost."""
    lost = (s.get("lost_gpu_seconds", {}).get("fair_share", 0) for s in data["shares"].values())
    return scenario.settings.fair_reclaim or any(lost)


def _groups_table(scenario: sc.Scenario, data: Mapping[str, Any]) -> str:
    """Per group of the organisation tree: what its subtree took from and lent outside itself, and its
    part of what it and its siblings took against its weight's part among them (SEMANTICS "Groups")."""
    groups = data.get("groups")
    if not groups:
        return ""
    specs = {g.name: g for g in scenario.groups}
    siblings: dict[str | None, list[str]] = {}
    for g in scenario.groups:
        siblings.setdefault(g.parent, []).append(g.name)
    head = (
        "<tr><th>group</th><th>parent</th><th>weight</th><th>borrow limit</th><th>lend limit</th>"
        "<th>GPU-h from outside</th><th>GPU-h lent outside</th><th>part of its level's GPU-h from outside</th>"
        "<th>weight's part of its level</th></tr>"
    )
    rows = []
    for g in scenario.groups:
        level = siblings[g.parent]
        taken = groups.get(g.name, {}).get("gpu_seconds_from_outside", 0)
        level_taken = sum(groups.get(x, {}).get("gpu_seconds_from_outside", 0) for x in level)
        level_weight = sum(specs[x].weight for x in level)
        part = f"{taken / level_taken:.0%}" if level_taken else "–"
        cells = [
            f"<th>{html.escape(g.name)}</th>",
            f"<td>{html.escape(g.parent or '(cluster)')}</td>",
            f"<td>{g.weight:g}</td>",
            f"<td>{'none' if g.borrow_limit == -1 else f'{g.borrow_limit}%'}</td>",
            f"<td>{'none' if g.lend_limit == -1 else f'{g.lend_limit}%'}</td>",
            f"<td>{taken / 3600:,.1f}</td>",
            f"<td>{groups.get(g.name, {}).get('gpu_seconds_lent_outside', 0) / 3600:,.1f}</td>",
            f"<td>{part}</td>",
            f"<td>{g.weight / level_weight:.0%}</td>",
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<h2>Groups</h2><table id="groups-table"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    )


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
  body {{ font-family: {font}; margin: 0 auto; max-width: 1280px; padding: 24px 32px; color: #1d1d24; }}
  h1 {{ font-size: 1.5rem; margin: 0 0 4px; }}
  h2 {{ font-size: 1.15rem; margin: 32px 0 6px; border-bottom: 1px solid #e4e4ea; padding-bottom: 4px; }}
  p.sub, p.note {{ color: #5a5a66; margin: 4px 0 12px; font-size: 0.92rem; }}
  .cards {{ display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }}
  .card {{ background: #f4f5f9; border-radius: 8px; padding: 10px 16px; min-width: 120px; }}
  .card .label {{ font-size: 0.78rem; color: #5a5a66; text-transform: uppercase; letter-spacing: .04em; }}
  .card .value {{ font-size: 1.2rem; font-weight: 600; margin-top: 2px; }}
  table {{ border-collapse: collapse; width: 100%; font-size: 0.9rem; }}
  th, td {{ padding: 6px 10px; border-bottom: 1px solid #e4e4ea; text-align: right; white-space: nowrap; }}
  thead th {{ background: #f4f5f9; font-weight: 600; }}
  tbody th, thead th:first-child, td:nth-child(2) {{ text-align: left; }}
  tbody tr:hover {{ background: #fafafe; }}
</style>
<script>{plotlyjs}</script>
</head>
<body>
<h1>{title}</h1>
<p class="sub">{description}</p>
<div class="cards">
{cards}
</div>
<h2>Own, lent and borrowed GPUs per share</h2>
<p class="note">Own GPUs and GPUs lent to others stay within the share's capacity (dashed); borrowed GPUs
come on top of it.</p>
<div id="usage" style="height:{usage_height}px"></div>
<h2>Attempts per node</h2>
<p class="note">One lane per GPU, one colour per share; × marks a pre-emption, ★ a lost node. {gantt_note}</p>
<div id="gantt" style="height:{gantt_height}px"></div>
<h2>Wait times per share</h2>
<p class="note">Wait = first start − submission. Jobs that never started are counted apart.</p>
{wait_table}
{forecast_section}
<script>
  const figures = {figures};
  const config = {{responsive: true, displaylogo: false}};
  Plotly.newPlot("usage", figures.usage.data, figures.usage.layout, config);
  Plotly.newPlot("gantt", figures.gantt.data, figures.gantt.layout, config);
</script>
</body>
</html>
"""
