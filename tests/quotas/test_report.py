"""The HTML report: self-contained, the three charts, and small enough for big runs."""

import json
import re
from pathlib import Path

import pytest

from quotas.engine import report
from quotas.engine import scenario as sc
from quotas.engine.simulate import Timeline, main, simulate

FIXTURES = Path(__file__).resolve().parent / "scenarios"


def figures(page: str) -> dict:
    return json.loads(re.search(r"const figures = (.*);\n", page).group(1).replace("<\\/", "</"))


@pytest.fixture(scope="module")
def page():
    scenario = sc.load(FIXTURES / "three-projects-borrow-reclaim.json")
    result = simulate(scenario)
    return report.render_report(scenario, result, result.timeline)


def test_it_has_the_three_charts(page):
    assert 'id="usage"' in page and 'id="gantt"' in page and 'id="wait-table"' in page
    figs = figures(page)
    stacked = [t for t in figs["usage"]["data"] if t.get("stackgroup")]
    assert {t["name"] for t in stacked} == {"own", "lent to others", "borrowed"}
    assert {t["stackgroup"] for t in stacked} == {"project-a", "project-b", "project-c"}
    bars = [t for t in figs["gantt"]["data"] if t["type"] == "bar"]
    assert sum(len(t["x"]) for t in bars) == 5  # a1, a2, a3 twice, b1
    marks = {t["name"]: t for t in figs["gantt"]["data"] if t["type"] == "scatter"}
    assert marks["pre-empted"]["x"] == [100]  # a3 at t=100
    assert figs["gantt"]["layout"]["xaxis"]["title"]["text"] == "virtual time (s)"


def test_the_usage_chart_shows_what_was_borrowed_and_lent(page):
    traces = {(t["stackgroup"], t["name"]): t for t in figures(page)["usage"]["data"] if t.get("stackgroup")}
    a_borrowed = traces[("project-a", "borrowed")]
    assert dict(zip(a_borrowed["x"], a_borrowed["y"], strict=True))[0] == 2  # a2 and a3 at t=0
    c_lent = traces[("project-c", "lent to others")]
    assert dict(zip(c_lent["x"], c_lent["y"], strict=True))[100] == 1


def test_the_wait_table_has_a_row_per_share(page):
    table = page[page.index('<table id="wait-table"') :]
    for share in ("project-a", "project-b", "project-c"):
        assert f"<th>{share}</th>" in table


def test_it_needs_no_network(page):
    for cdn in ("cdn.plot.ly", "cdn.jsdelivr", "unpkg.com", "cdnjs", "googleapis"):
        assert cdn not in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert "Plotly.newPlot" in page
    assert page.count("<script>") == 2  # plotly.js inline, then the figures


def test_a_big_run_is_downsampled():
    nodes = [sc.Node(name=f"n{i:03d}", gpu_type="a", gpus=8) for i in range(64)]
    shares = (sc.Share(name="s", team="s", capacity={"a": 512}),)
    jobs, attempts = [], {}
    timeline = Timeline()
    for k in range(40_000):
        node, start = nodes[k % 64].name, (k // 64) * 10
        jobs.append(sc.Job(id=f"j{k}", share="s", submit_at=start, duration_s=10, gpus=8, gpu_type="a"))
        attempts[f"j{k}"] = {
            "final": "SUCCEEDED",
            "submit_at": start,
            "first_start": start,
            "end": start + 10,
            "wait_s": 0,
            "preemptions": 0,
            "attempts": [
                {
                    "start": start,
                    "end": start + 10,
                    "nodes": [node],
                    "borrowed": False,
                    "outcome": "SUCCEEDED",
                    "preempted_by": None,
                    "reason": "ADMITTED_OWN",
                }
            ],
        }
        timeline.record(start, {("s", "a", "own"): 8 + k % 7, ("s", "a", "capacity"): 512})
    end = 40_000 // 64 * 10
    timeline.end = end
    scenario = sc.Scenario(settings=sc.Settings(), nodes=tuple(nodes), shares=shares, jobs=tuple(jobs))
    result = {
        "jobs": attempts,
        "shares": {
            "s": {
                "gpu_seconds_own": 1,
                "gpu_seconds_borrowed": 0,
                "gpu_seconds_lent": 0,
                "mean_wait_s": 0,
                "p95_wait_s": 0,
                "preempted_jobs": 0,
            }
        },
        "cluster": {"makespan_s": end, "utilisation": 1.0, "lost_gpu_seconds": 0, "passes": 1},
    }
    page = report.render_report(scenario, result, timeline)
    figs = figures(page)
    assert all(len(t["x"]) <= report.MAX_POINTS + 1 for t in figs["usage"]["data"])
    assert sum(len(t["x"]) for t in figs["gantt"]["data"]) <= report.MAX_BARS
    assert "Showing the first" in page
    assert len(page) < 7_000_000  # plotly.js is about 4.8 MB of it


def test_the_cli_writes_a_report(tmp_path):
    out = tmp_path / "report.html"
    assert (
        main(
            [
                str(FIXTURES / "reserve-and-priority.json"),
                "--out",
                str(tmp_path / "r.json"),
                "--report",
                str(out),
            ]
        )
        == 0
    )
    assert "Attempts per node" in out.read_text()
