"""The trace importer (quotas.engine.importtrace): an ITP-shaped CSV or Slurm's sacct --parsable2
output becomes a valid scenario; rows that cannot become jobs are counted, never a traceback."""

from __future__ import annotations

import json

import pytest

from quotas.engine import importtrace as it
from quotas.engine import scenario as sc

ITP = """submit_s,duration_s,gpus,group
0,600,1,c01
10,1200,8,c02
20,3600,16,c02
30,700,2,c03
40,900,1,c04
"""


def _import(text: str, **opts):
    return it.import_trace(text.splitlines(keepends=True), it.Options(**opts))


def test_an_itp_trace_becomes_a_valid_scenario_with_one_share_per_group():
    scenario, report = _import(ITP, nodes=4, node_gpus=8, gpu_type="a100", top=8)
    parsed = sc.parse(scenario)
    assert report.rows == 5 and report.jobs == 5 and not report.skipped
    assert [j.id for j in parsed.jobs] == ["j000001", "j000002", "j000003", "j000004", "j000005"]
    assert {s.name for s in parsed.shares} == {"c01", "c02", "c03", "c04"}
    assert sum(s.capacity["a100"] for s in parsed.shares) == 32
    assert all(s.strategy == "LEND_AND_BORROW" and s.borrow_limit == -1 for s in parsed.shares)
    job = parsed.jobs[2]
    assert (job.share, job.submit_at, job.duration_s, job.gpus, job.gpu_type) == ("c02", 20, 3600, 16, "a100")


def test_capacity_is_in_proportion_to_gpu_hours_by_largest_remainder():
    assert it.largest_remainder({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    assert it.largest_remainder({"a": 6, "b": 3, "c": 1}, 7) == {"a": 4, "b": 2, "c": 1}
    split = it.largest_remainder({"x": 0.3, "y": 0.0, "z": 12.7}, 1344)
    assert sum(split.values()) == 1344 and split["y"] == 0


def test_the_groups_beyond_the_top_n_share_one_share_named_other():
    scenario, _ = _import(ITP, nodes=4, node_gpus=8, top=2)
    names = [s["name"] for s in scenario["shares"]]
    assert names == ["c02", "c03", "other"]  # c02 and c03 have the most GPU-hours; other last
    assert {j["share"] for j in scenario["jobs"] if j["id"] in ("j000001", "j000005")} == {"other"}


def test_the_window_keeps_jobs_submitted_in_it_and_rebases_its_start_to_zero():
    scenario, report = _import(ITP, nodes=4, start=10, end=40)
    assert [(j["id"], j["submit_at"]) for j in scenario["jobs"]] == [
        ("j000002", 0),
        ("j000003", 10),
        ("j000004", 20),
    ]
    assert report.outside_window == 2


def test_checkpoints_go_to_the_drawn_fraction_of_jobs_and_the_same_seed_draws_the_same():
    rows = "submit_s,duration_s,gpus,group\n" + "".join(f"{i},3600,1,c01\n" for i in range(400))
    a, _ = _import(rows, nodes=2, checkpoint_fraction=0.5, checkpoint_every_s=900, seed=7)
    b, _ = _import(rows, nodes=2, checkpoint_fraction=0.5, checkpoint_every_s=900, seed=7)
    c, _ = _import(rows, nodes=2, checkpoint_fraction=0.5, checkpoint_every_s=900, seed=8)
    drawn = [j["checkpoint_every_s"] for j in a["jobs"]]
    assert set(drawn) == {None, 900}
    assert 150 < drawn.count(900) < 250
    assert a == b and a != c


def test_bad_rows_are_counted_by_reason_with_their_lines_and_the_rest_imported():
    text = (
        "submit_s,duration_s,gpus,group\n"
        "0,600,1,c01\n"
        "x,600,1,c01\n"  # line 3
        "5,0,1,c01\n"  # line 4
        "5,600,0,c01\n"  # line 5
        "5,600,12,c01\n"  # line 6: not whole 8-GPU nodes
        "5,600\n"  # line 7
        "5,600,1,\n"  # line 8
    )
    scenario, report = _import(text, nodes=4)
    assert report.jobs == 1 and report.rows == 7
    assert report.examples == {
        "rows whose submit_s is not a whole number >= 0": [3],
        "rows whose duration_s is not a whole number >= 1": [4],
        "jobs without GPUs": [5],
        "jobs no node shape of 4 x 8 GPUs can hold": [6],
        "rows with too few fields": [7],
        "rows without a group": [8],
    }
    assert "6 skipped" in report.text()


def test_rows_the_csv_reader_cannot_read_are_counted_too():
    text = (
        "submit_s,duration_s,gpus,group\n"
        "0,600,1,c01\n"
        "5,6\x0000,1,c01\n"  # line 3: a NUL in a number
        "7," + "9" * 200_000 + ",1,c01\n"  # line 4: a field over the CSV reader's limit
        "9,600,1,c02\n"
        "10,1e400,1,c02\n"  # line 6: not a whole number
    )
    scenario, report = _import(text, nodes=2)
    assert [j["id"] for j in scenario["jobs"]] == ["j000001", "j000004"]
    assert report.examples["rows the CSV reader cannot read"] == [4]
    assert report.examples["rows whose duration_s is not a whole number >= 1"] == [3, 6]


def test_a_trace_that_leaves_no_job_or_has_no_header_is_refused_with_a_reason():
    with pytest.raises(it.TraceError, match="no job left"):
        _import("submit_s,duration_s,gpus,group\nx,y,z,w\n")
    with pytest.raises(it.TraceError, match="no column"):
        _import("a,b,c\n1,2,3\n")
    with pytest.raises(it.TraceError, match="empty"):
        _import("")


SACCT = """JobID|Account|QOS|Submit|Start|End|AllocTRES|ReqTRES|State
100|vision|normal|2024-03-01T10:00:00|2024-03-01T10:00:30|2024-03-01T11:00:30|billing=8,cpu=8,gres/gpu=2,mem=64G,node=1|cpu=8,gres/gpu=2|COMPLETED
100.batch|vision|normal|2024-03-01T10:00:00|2024-03-01T10:00:30|2024-03-01T11:00:30|cpu=8,gres/gpu=2|cpu=8|COMPLETED
101|nlp|high|2024-03-01T10:05:00|2024-03-01T10:06:00|2024-03-01T10:16:00|cpu=4,gres/gpu:a100=4,mem=1G|cpu=4,gres/gpu=4|COMPLETED
102|nlp|high|2024-03-01T10:06:00|Unknown|Unknown||cpu=4,gres/gpu=1|PENDING
103|nlp|high|2024-03-01T10:07:00|2024-03-01T10:07:00|Unknown|cpu=4,gres/gpu=1|cpu=4,gres/gpu=1|RUNNING
104|cpu-only|normal|2024-03-01T10:08:00|2024-03-01T10:08:00|2024-03-01T10:09:00|cpu=4,mem=1G|cpu=4|COMPLETED
105_3|vision|normal|2024-03-01T10:09:00|2024-03-01T10:10:00|2024-03-01T10:40:00||cpu=1,gres/gpu:v100=1,gres/gpu:a100=1|FAILED
"""


def test_sacct_parsable2_output_becomes_jobs_with_gpus_from_tres_and_accounts_as_shares():
    scenario, report = _import(SACCT, nodes=2, node_gpus=8, gpu_type="a100")
    jobs = {j["id"]: j for j in scenario["jobs"]}
    assert set(jobs) == {"100", "101", "105_3"}  # the step 100.batch is the job's line, not a job
    assert (jobs["100"]["submit_at"], jobs["100"]["duration_s"], jobs["100"]["gpus"]) == (0, 3600, 2)
    assert (jobs["101"]["submit_at"], jobs["101"]["duration_s"], jobs["101"]["gpus"]) == (300, 600, 4)
    assert jobs["105_3"]["gpus"] == 2  # AllocTRES empty: ReqTRES, the typed GPUs summed
    assert jobs["101"]["share"] == "nlp" and jobs["100"]["share"] == "vision"
    assert report.skipped == {
        "jobs that never started": 1,
        "jobs still running (no End)": 1,
        "jobs without GPUs": 1,
    }
    sc.parse(scenario)


def test_sacct_times_with_a_zone_mix_with_times_without():
    text = SACCT.replace(
        "2024-03-01T10:05:00|2024-03-01T10:06:00", "2024-03-01T11:05:00+01:00|2024-03-01T10:06:00"
    )
    scenario, _ = _import(text, nodes=2)
    assert {j["id"]: j["submit_at"] for j in scenario["jobs"]}["101"] == 300


def test_sacct_shares_can_be_the_qos_and_the_window_given_as_dates():
    scenario, _ = _import(SACCT, nodes=2, group="qos", start="2024-03-01T10:04:00")
    assert {j["id"]: j["share"] for j in scenario["jobs"]} == {"101": "high", "105_3": "normal"}
    assert [j["submit_at"] for j in scenario["jobs"]] == [60, 300]


def test_a_layout_file_gives_the_shares_and_which_groups_each_takes():
    layout = [
        {"name": "research", "capacity": {"a100": 24}, "groups": ["c01", "c02"], "min_runtime_s": 600},
        {"name": "rest", "capacity": {"a100": 8}, "strategy": "LEND", "groups": ["*"]},
    ]
    scenario, _ = _import(ITP, nodes=4, layout=layout)
    assert {j["id"]: j["share"] for j in scenario["jobs"]} == {
        "j000001": "research",
        "j000002": "research",
        "j000003": "research",
        "j000004": "rest",
        "j000005": "rest",
    }
    assert sc.parse(scenario).shares[0].min_runtime_s == 600
    narrow = [{"name": "only", "capacity": {"a100": 8}, "groups": ["c02"]}]
    _, report = _import(ITP, nodes=4, layout=narrow)
    assert report.skipped == {"jobs of a group no share of the layout takes": 3}
    with pytest.raises(it.TraceError, match="not valid"):
        _import(ITP, nodes=4, layout=[{"name": "x", "capacity": {"a100": 8}, "groups": ["*"], "bogus": 1}])


def test_the_command_line_writes_the_scenario_and_reports_skips_exit_2_for_nothing(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(ITP + "oops,1,1,c01\n")
    out = tmp_path / "s.json"
    argv = [
        str(trace),
        "--nodes",
        "4",
        "--out",
        str(out),
        "--checkpoint-fraction",
        "1",
        "--checkpoint-on-stop",
    ]
    assert it.main([*argv, "--min-runtime", "600"]) == 0
    scenario = json.loads(out.read_text())
    assert len(scenario["jobs"]) == 5 and all(j["checkpoint_every_s"] == 1800 for j in scenario["jobs"])
    parsed = sc.parse(scenario)
    assert all(j.checkpoint_on_stop for j in parsed.jobs) and all(
        s.min_runtime_s == 600 for s in parsed.shares
    )
    err = capsys.readouterr().err
    assert "5 jobs imported" in err and "1 rows whose submit_s" in err and "(lines 7)" in err
    assert it.main([str(tmp_path / "missing.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "bin").write_bytes(b"\x00\xff\xfe garbage")
    assert it.main([str(tmp_path / "bin")]) == 2
    assert it.main([str(trace), "--checkpoint-fraction", "2"]) == 2
    assert it.main([str(trace), "--start", "yesterday"]) == 2


def test_the_itp_file_gives_the_benchmark_window_of_issue_26():
    path = it.ITP_TRACE
    if not path.exists():
        pytest.skip(f"{path} is not here")
    with open(path, encoding="utf-8", newline="") as f:
        scenario, report = it.import_trace(f, it.Options(start=1_209_600, end=2_419_200))
    assert report.jobs == 23_981 and not report.skipped
    assert len(scenario["shares"]) == 9 and scenario["shares"][-1]["name"] == "other"
    assert sum(s["capacity"]["a100"] for s in scenario["shares"]) == 168 * 8
