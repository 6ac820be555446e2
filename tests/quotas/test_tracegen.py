"""The trace generator: deterministic, valid, and shaped like the published traces it cites."""

import json
import statistics
from pathlib import Path

import pytest

from quotas.engine import policy, tracegen
from quotas.engine import scenario as sc
from quotas.engine.simulate import simulate


@pytest.fixture(scope="module")
def trace():
    return tracegen.generate(teams=6, gpus=512, jobs=20000, seed=1)


def test_it_is_deterministic_for_a_seed(capsys):
    args = ["--teams", "4", "--gpus", "64", "--jobs", "300", "--seed", "7"]
    assert tracegen.main(args) == 0
    first = capsys.readouterr().out
    assert tracegen.main(args) == 0
    assert capsys.readouterr().out == first
    assert tracegen.main([*args[:-1], "8"]) == 0
    assert capsys.readouterr().out != first


def test_it_writes_a_valid_scenario(trace):
    scenario = sc.parse(json.loads(json.dumps(trace)))
    assert len(scenario.jobs) == 20000
    assert {n.gpus for n in scenario.nodes} == {8}
    assert sum(n.gpus for n in scenario.nodes) == 512
    assert len({n.gpu_type for n in scenario.nodes}) == 1
    caps = [s.capacity["v100"] for s in scenario.shares]
    assert len(caps) == 6 and sum(caps) == 512 and all(c % 8 == 0 and c > 0 for c in caps)
    assert policy.LEND_AND_BORROW in {s.strategy for s in scenario.shares}
    assert "Helios" in scenario.description


def test_job_shapes_are_in_the_published_neighbourhood(trace):
    gpus = [j["gpus"] for j in trace["jobs"]]
    runs = [j["duration_s"] for j in trace["jobs"]]
    # Helios 3.72 GPUs per job (Venus 6.74, Philly 1.93), median 1 GPU (Philly).
    assert 3.0 <= statistics.mean(gpus) <= 4.5
    assert statistics.median(gpus) == 1
    assert 0.6 <= gpus.count(1) / len(gpus) <= 0.8
    assert max(gpus) >= 64
    assert all(g & (g - 1) == 0 for g in gpus)  # powers of two
    assert all(g % 8 == 0 for g in gpus if g > 8)  # gangs of whole nodes
    # Median run a few minutes (Helios 206 s, Venus 204 s, Philly 874 s); heavy tail to days.
    assert 150 <= statistics.median(runs) <= 600
    assert 1500 <= statistics.mean(runs) <= 18006
    assert sum(r > 86400 for r in runs) >= 10


def test_arrivals_are_bursty(trace):
    times = [j["submit_at"] for j in trace["jobs"]]
    assert times == sorted(times)
    per_hour = [0] * (times[-1] // 3600 + 1)
    for t in times:
        per_hour[t // 3600] += 1
    mean = statistics.mean(per_hour)
    # A Poisson process has variance = mean; the MMPP's bursts make it much larger.
    assert statistics.pvariance(per_hour) > 3 * mean


def test_no_job_is_larger_than_its_share_could_ever_hold(trace):
    shares = {s["name"]: s for s in trace["shares"]}
    for job in trace["jobs"]:
        share = shares[job["share"]]
        if share["strategy"] != policy.LEND_AND_BORROW:
            assert job["gpus"] <= share["capacity"]["v100"]


def test_the_data_is_read_from_shared_beside_the_checkout():
    checkout = Path(tracegen.__file__).resolve().parents[2]
    assert checkout.parent / "shared" / "data" == tracegen.SHARED_DATA
    assert tracegen.VENUS_CSV.exists() and tracegen.ITP_CSV.exists(), f"no {tracegen.SHARED_DATA}"


def test_the_built_in_vc_table_is_the_csv_row():
    assert tracegen.venus_vc_sizes() == tracegen.VENUS_VC_GPUS


def test_another_vc_day_reads_the_csv(capsys):
    assert tracegen.main(["--teams", "4", "--gpus", "64", "--jobs", "50", "--vc-day", "2020-06-01"]) == 0
    assert "--vc-day 2020-06-01" in json.loads(capsys.readouterr().out)["description"]
    assert sum(tracegen.venus_vc_sizes("2020-06-01").values()) != sum(tracegen.VENUS_VC_GPUS.values())


@pytest.fixture(scope="module")
def itp():
    return tracegen.itp_scenario()


def test_the_itp_trace_is_replayed_as_its_readme_describes_it(itp):
    """../shared/data/README.md: 69,351 jobs in 10 clusters; run time median 10,537 s, mean 18,722 s,
    p99 210,241 s, none under 600 s; GPUs median 1, mean 2.14, 83% one GPU, 1.2% wider than 8, all
    powers of two; 1,632,720 GPU-hours."""
    jobs = itp["jobs"]
    runs = sorted(j["duration_s"] for j in jobs)
    gpus = [j["gpus"] for j in jobs]
    assert len(jobs) == 69_351 and {s["name"] for s in itp["shares"]} == {f"c{i:02d}" for i in range(1, 11)}
    assert statistics.median(runs) == 10_537 and round(statistics.mean(runs)) == 18_722
    assert runs[int(0.99 * len(runs))] == 210_241 and runs[0] >= 600
    assert statistics.median(gpus) == 1 and round(statistics.mean(gpus), 2) == 2.14
    assert (
        round(gpus.count(1) / len(gpus), 2) == 0.83
        and round(sum(g > 8 for g in gpus) / len(gpus), 3) == 0.012
    )
    assert all(g & (g - 1) == 0 for g in gpus)
    assert round(sum(j["gpus"] * j["duration_s"] for j in jobs) / 3600) == 1_632_720
    times = [j["submit_at"] for j in jobs]
    assert times == sorted(times) and times[0] == 0


def test_the_itp_shares_split_the_cluster_by_each_clusters_work(itp):
    scenario = sc.parse(itp)
    assert sum(n.gpus for n in scenario.nodes) == tracegen.ITP_GPUS
    caps = {s.name: s.capacity["v100"] for s in scenario.shares}
    assert sum(caps.values()) == tracegen.ITP_GPUS and all(c % 8 == 0 and c > 0 for c in caps.values())
    work = {}
    for j in itp["jobs"]:
        work[j["share"]] = work.get(j["share"], 0) + j["gpus"] * j["duration_s"]
    busiest = max(work, key=work.get)
    assert caps[busiest] == max(caps.values())
    assert {s.strategy for s in scenario.shares} == {policy.LEND_AND_BORROW}


def test_a_slice_of_the_itp_trace_simulates(capsys):
    assert tracegen.main(["--itp", "--gpus", "256", "--jobs", "2000"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["jobs"]) == 2000 and "ITP" in data["description"]
    result = simulate(sc.parse(data))
    assert {r.final for r in result.jobs.values()} == {"SUCCEEDED"} and len(result.jobs) == 2000
    assert 0 < result.cluster["utilisation"] <= 1


def test_it_works_without_the_csv(tmp_path):
    assert tracegen.venus_vc_sizes(csv_path=tmp_path / "missing.csv") == tracegen.VENUS_VC_GPUS


def test_bad_arguments_exit_2(capsys):
    assert tracegen.main(["--gpus", "100"]) == 2
    assert "multiple of 8" in capsys.readouterr().err


def test_a_small_trace_simulates_to_the_end():
    result = simulate(tracegen.generate(teams=3, gpus=32, jobs=150, seed=2))
    finals = {job.final for job in result.jobs.values()}
    assert finals <= {"SUCCEEDED", "FAILED"}
