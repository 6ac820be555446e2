"""Lost work (SEMANTICS "Checkpoints and safe points", SCENARIO.md result): when an attempt stops before
it succeeds, its GPUs x the time since its safe point are lost, counted per share by cause (reclaim,
in-share priority, node lost); `checkpoint_on_stop` jobs save when told to stop, so a pre-emption loses
nothing (a lost node still does); the shares add up to the cluster's total, and the report shows it."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings

from quotas.engine import report
from quotas.engine import scenario as sc
from quotas.engine.simulate import main, simulate
from tests.quotas.test_simulate import random_scenarios


def _scenario(*, on_stop=False, every=None):
    """b borrows a's 2 idle GPUs from t=0 with a 2-GPU job (checkpointing as asked); a's job at t=300
    reclaims them (grace 0). In share a, a priority-9 job at t=1000 pre-empts a's priority-0 job.
    Node n2 (1 GPU, c's) is lost at t=500 under c's job."""
    job = {"gpu_type": "g", "checkpoint_on_stop": on_stop, "checkpoint_every_s": every}
    return {
        "settings": {"preemption_grace_s": 0},
        "nodes": [
            {"name": "n1", "gpu_type": "g", "gpus": 2},
            {"name": "n2", "gpu_type": "g", "gpus": 1, "lost_at": 500},
        ],
        "shares": [
            {"name": "a", "capacity": {"g": 2}, "in_share_preemption": True},
            {"name": "b", "capacity": {"g": 0}},
            {"name": "c", "capacity": {"g": 1}, "strategy": "RESERVE"},
        ],
        "jobs": [
            {**job, "id": "b1", "share": "b", "submit_at": 0, "duration_s": 10_000, "gpus": 2},
            {**job, "id": "a-lo", "share": "a", "submit_at": 300, "duration_s": 5000, "gpus": 2},
            {
                **job,
                "id": "a-hi",
                "share": "a",
                "submit_at": 1000,
                "duration_s": 100,
                "gpus": 2,
                "priority": 9,
            },
            {**job, "id": "c1", "share": "c", "submit_at": 100, "duration_s": 10_000, "gpus": 1},
        ],
    }


def _lost(result):
    return {name: share["lost_gpu_seconds"] for name, share in result.shares.items()}


def test_lost_work_is_counted_per_share_by_cause():
    result = simulate(_scenario())
    assert _lost(result) == {
        "a": {
            "reclaim": 0,
            "priority": 2 * 700,
            "fair_share": 0,
            "node_lost": 0,
        },  # a-lo ran 300..1000 on 2 GPUs
        "b": {"reclaim": 2 * 300, "priority": 0, "fair_share": 0, "node_lost": 0},  # b1 ran 0..300
        "c": {
            "reclaim": 0,
            "priority": 0,
            "fair_share": 0,
            "node_lost": 400,
        },  # c1 ran 100..500 on the lost node
    }
    assert result.cluster["lost_gpu_seconds"] == 1400 + 600 + 400


def test_only_the_work_since_the_last_checkpoint_is_lost():
    result = simulate(_scenario(every=120))
    assert _lost(result) == {
        "a": {"reclaim": 0, "priority": 2 * (700 % 120), "fair_share": 0, "node_lost": 0},
        "b": {"reclaim": 2 * (300 % 120), "priority": 0, "fair_share": 0, "node_lost": 0},
        "c": {"reclaim": 0, "priority": 0, "fair_share": 0, "node_lost": 400 % 120},
    }


def test_a_job_that_saves_when_told_to_stop_loses_nothing_to_preemption_but_does_to_a_lost_node():
    result = simulate(_scenario(on_stop=True))
    assert _lost(result) == {
        "a": {"reclaim": 0, "priority": 0, "fair_share": 0, "node_lost": 0},
        "b": {"reclaim": 0, "priority": 0, "fair_share": 0, "node_lost": 0},
        "c": {"reclaim": 0, "priority": 0, "fair_share": 0, "node_lost": 400},
    }
    # What it saved is kept: a-lo resumes with 700 s of its 5,000 done.
    a_lo = result.jobs["a-lo"].attempts
    assert a_lo[1].end - a_lo[1].start == 5000 - 700


def test_a_lost_node_loses_the_work_since_the_last_save_even_one_made_at_a_stop():
    # c2 saves when stopped: pre-empted by nothing here, it loses its node at 500 having run from 0;
    # its earlier stop-save (none) is its safe point: it loses everything, 500 s.
    data = _scenario(on_stop=True)
    data["jobs"] = [j for j in data["jobs"] if j["id"] != "c1"]
    data["jobs"].append(
        {
            "id": "c2",
            "share": "c",
            "submit_at": 0,
            "duration_s": 900,
            "gpus": 1,
            "gpu_type": "g",
            "checkpoint_on_stop": True,
        }
    )
    assert _lost(simulate(data))["c"] == {"reclaim": 0, "priority": 0, "fair_share": 0, "node_lost": 500}


def test_checkpoint_on_stop_must_be_true_or_false_and_the_error_names_the_job(tmp_path, capsys):
    data = _scenario()
    data["jobs"][1]["checkpoint_on_stop"] = "yes"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    assert main([str(path)]) == 2
    assert 'jobs[1] (id "a-lo"): checkpoint_on_stop must be true or false' in capsys.readouterr().err


def test_the_report_shows_lost_work_per_share_by_cause():
    scenario = sc.parse(_scenario())
    result = simulate(scenario)
    page = report.render_report(scenario, result, result.timeline)
    table = page[page.index('<table id="wait-table"') :]
    assert "GPU-h lost: reclaim" in table and "GPU-h lost: node lost" in table
    row = table[table.index("<th>a</th>") : table.index("</tr>", table.index("<th>a</th>"))]
    assert f"<td>{1400 / 3600:,.2f}</td>" in row


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_scenarios())
def test_property_lost_work_per_share_adds_up_to_the_clusters_and_to_its_attempts(data):
    result = simulate(data)
    spec = {j["id"]: j for j in data["jobs"]}
    expected: dict[str, dict[str, int]] = {
        s["name"]: {"reclaim": 0, "priority": 0, "fair_share": 0, "node_lost": 0} for s in data["shares"]
    }
    for job_id, job in result.jobs.items():
        every = spec[job_id].get("checkpoint_every_s")
        for a in job.attempts:
            if a.preemption_reason is not None:  # stopped by a pre-emption (PREEMPTED, or FAILED past max)
                cause = a.preemption_reason.lower()
                lost = (
                    0
                    if spec[job_id]["checkpoint_on_stop"]
                    else a.gpus * ((a.end - a.start) % every if every else a.end - a.start)
                )
            elif a.outcome == "NODE_LOST":
                cause, lost = "node_lost", a.gpus * ((a.end - a.start) % every if every else a.end - a.start)
            else:
                continue
            expected[spec[job_id]["share"]][cause] += lost
    assert {n: s["lost_gpu_seconds"] for n, s in result.shares.items()} == expected
    assert sum(sum(by.values()) for by in expected.values()) == result.cluster["lost_gpu_seconds"]
