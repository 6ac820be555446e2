"""`python manage.py import_trace`: the trace importer in the product, with the engine CLI's options and
answers; every bad input is exit code 2 with a message naming it, no traceback, and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quotas.engine import scenario as sc

ROOT = Path(__file__).resolve().parents[2]
ITP = "submit_s,duration_s,gpus,group\n0,600,1,c01\n10,1200,8,c02\n20,3600,16,c02\nlater,1,1,c01\n"
SACCT = (
    "JobID|Account|Submit|Start|End|AllocTRES\n"
    "1|vision|2026-11-01T10:00:00|2026-11-01T10:01:00|2026-11-01T11:01:00|cpu=4,gres/gpu=2\n"
    "2|lang|2026-11-01T10:05:00|2026-11-01T10:06:00|2026-11-01T10:36:00|cpu=4,gres/gpu=1\n"
)


def manage(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "manage.py", "import_trace", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_turns_an_itp_shaped_trace_into_a_scenario_and_counts_the_rows_it_skipped(tmp_path):
    trace, out = tmp_path / "t.csv", tmp_path / "scenario.json"
    trace.write_text(ITP)
    done = manage(trace, "--out", out, "--nodes", 4, "--node-gpus", 8, "--min-runtime", 600)
    assert done.returncode == 0, done.stderr
    scenario = sc.parse(json.loads(out.read_text()))
    assert len(scenario.jobs) == 3 and all(s.min_runtime_s == 600 for s in scenario.shares)
    assert "1 rows whose submit_s is not a whole number >= 0 (lines 5)" in done.stderr
    assert "Traceback" not in done.stderr


def test_it_reads_sacct_output_too(tmp_path):
    trace, out = tmp_path / "sacct.txt", tmp_path / "s.json"
    trace.write_text(SACCT)
    done = manage(trace, "--out", out, "--nodes", 2, "--node-gpus", 4, "--gpu-type", "a10g")
    assert done.returncode == 0, done.stderr
    scenario = sc.parse(json.loads(out.read_text()))
    assert {s.name for s in scenario.shares} == {"vision", "lang"} and len(scenario.jobs) == 2


@pytest.mark.parametrize(
    "args, words",
    [
        (["{missing}"], "cannot read {missing}"),
        (["{empty}"], "the trace is empty"),
        (["{trace}", "--nodes", "0"], "--nodes and --node-gpus must be at least 1"),
        (["{trace}", "--top", "-1"], "--top must be 0"),
        (["{trace}", "--checkpoint-fraction", "2"], "--checkpoint-fraction must be between 0 and 1"),
        (["{trace}", "--start", "soon"], "--start must be seconds from the first submission or an ISO date"),
        (["{trace}", "--start", "5", "--end", "1"], "no job left to import"),
        (["{trace}", "--layout", "{trace}"], "cannot read the layout"),
        (["{trace}", "--format", "sacct"], "not sacct --parsable2 output"),
        (["{trace}", "--out", "{nowhere}/s.json"], "cannot write {nowhere}/s.json"),
        (["{trace}", "--nodes", "many"], "argument --nodes: invalid int value: 'many'"),
        ([], "the following arguments are required: trace"),
    ],
)
def test_bad_input_is_exit_code_2_with_a_message_and_nothing_written(tmp_path, args, words):
    paths = {
        "trace": tmp_path / "t.csv",
        "missing": tmp_path / "missing.csv",
        "empty": tmp_path / "empty.csv",
        "nowhere": tmp_path / "no" / "such" / "dir",
    }
    paths["trace"].write_text(ITP)
    paths["empty"].write_text("")
    out = tmp_path / "out.json"
    argv = [a.format(**paths) for a in args]
    done = manage(*argv, *([] if "--out" in argv or not argv else ["--out", out]))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert words.format(**paths) in done.stderr and "Traceback" not in done.stderr
    assert not out.exists() and not (paths["nowhere"]).exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_its_usage_names_the_command(tmp_path):
    done = manage("--help")
    assert (
        done.returncode == 0
        and "manage.py import_trace" in done.stdout
        and "--checkpoint-fraction" in done.stdout
    )


def test_help_gives_every_default():
    """`import_trace --help` gave no defaults (issue 42.6)."""
    done = manage("--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps the lines
    for default in ("168", "8", "a100", "account", "LEND_AND_BORROW", "3600", "1800", "0.0"):
        assert f"(default: {default})" in text, default
    assert "--grace GRACE settings.preemption_grace_s (default: 30)" in text
