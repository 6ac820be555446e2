"""Numbers that cannot mislead (issue 28): utilisation over the replayed window, not over a replay that
runs on to its cut; jobs that never start counted (as waiting until the cut) and said in plain words;
the sweep and the what-if give the same figures for the same value."""

import io

import pytest
from django.core.management import call_command

from quotas import whatif
from quotas.engine import measures, simulate
from quotas.engine import scenario as sc

SETTINGS = sc.Settings(tick_s=1, until_s=20 * 3600)


def scenario(jobs, shares, nodes=(sc.Node("n1", "a100", 8),)):
    return sc.Scenario(settings=SETTINGS, nodes=tuple(nodes), shares=tuple(shares), jobs=tuple(jobs))


def test_one_job_that_never_starts_does_not_divide_the_utilisation_by_the_cut():
    """The finding: with a borrow limit of 0 the what-if showed 52.3% -> 0.4%, because one job that
    could never start ran the replay on to its cut and the utilisation was divided by all of it."""
    team = sc.Share("team-1", "t1", {"a100": 4}, borrow_limit=0)
    jobs = [sc.Job(f"j{i}", "team-1", i * 3600, 3600, 4, "a100") for i in range(4)]
    jobs.append(sc.Job("big", "team-1", 0, 3600, 8, "a100"))  # 8 > 4 own + 0 borrowed: never
    s = scenario(jobs, [team])
    result = simulate.simulate(s)
    window = 4 * 3600
    assert result.cluster["makespan_s"] == 20 * 3600  # cut: "big" never started
    assert 100 * result.cluster["utilisation"] == pytest.approx(10, abs=0.1)  # 16 GPU-h / (8 GPUs x 20 h)
    assert measures.utilisation(s, result, window) == 50.0  # 16 GPU-h / (8 GPUs x 4 h)


def test_jobs_that_never_start_count_as_waiting_until_the_cut_and_are_named():
    """The finding: `--variant LEND:team-1` showed team-1's mean wait 99% better while 13 of its jobs
    could never start: they were left out of the waits."""
    team = sc.Share("team-1", "t1", {"a100": 40}, strategy="LEND")
    other = sc.Share("team-2", "t2", {"a100": 24})
    jobs = [sc.Job(f"ok{i}", "team-1", 0, 600, 8, "a100") for i in range(5)]
    jobs += [sc.Job(f"big{i}", "team-1", 60, 600, 64, "a100") for i in range(13)]
    nodes = [sc.Node(f"n{i}", "a100", 8) for i in range(8)]
    s = scenario(jobs, [team, other], nodes)
    result = simulate.simulate(s)
    assert result.shares["team-1"]["p95_wait_s"] == 0  # the simulator's own: the 13 left out
    figures = measures.shares(s, result, 3600)["team-1"]
    assert figures["never_started"] == 13
    assert figures["wait_p95_s"] == 20 * 3600 - 60  # waited at least until the cut
    assert figures["by_priority"]["0"] == {"jobs": 18, "p50": 20 * 3600 - 60, "p95": 20 * 3600 - 60}
    [words] = measures.never_started(s, result)
    assert words == (
        "13 jobs of team-1 need 64 a100 each: team-1 is LEND with 40 a100: a 64-GPU job can never start there"
    )


def test_a_job_still_waiting_at_the_cut_says_so_with_its_reason():
    team = sc.Share("team-1", "t1", {"a100": 8}, strategy="RESERVE")
    jobs = [sc.Job("long", "team-1", 0, 30 * 3600, 8, "a100"), sc.Job("next", "team-1", 10, 60, 8, "a100")]
    s = scenario(jobs, [team])
    result = simulate.simulate(s)
    [words] = measures.never_started(s, result)
    assert words.startswith(
        "1 job of team-1 (8 a100 each) never started: still waiting at the cut, 20 h after"
    )


def test_gpu_hours_borrowed_and_lent_are_counted_within_the_window():
    lender = sc.Share("lender", "a", {"a100": 8}, strategy="LEND")
    borrower = sc.Share("borrower", "b", {"a100": 0})
    s = scenario([sc.Job("b1", "borrower", 0, 7200, 8, "a100")], [lender, borrower])
    result = simulate.simulate(s)
    figures = measures.shares(s, result, 3600)
    assert figures["borrower"]["borrowed_gpu_hours"] == 8.0 and figures["borrower"]["gpu_hours_run"] == 8.0
    assert figures["lender"]["lent_gpu_hours"] == 8.0


@pytest.fixture
def history(no_messages, db):
    call_command("seed_history", jobs=300, stdout=io.StringIO())
    return "hist-team-1"


def test_the_sweep_and_the_whatif_give_the_same_figures_for_the_same_value(celery_eager, history, alice):
    from quotas import layout
    from quotas.models import Share

    sweep = whatif.status(
        whatif.start_sweep(share=history, setting="borrow_limit", values=[0, 50], labels=["0 %", "50 %"])
    )
    share = Share.objects.select_related("team").get(name=history)
    entry = {
        "name": history,
        "team": share.team.slug,
        "capacity": share.capacity_map(),
        "strategy": share.strategy,
        "borrow_limit": 0,
        "in_share_preemption": share.in_share_preemption,
        "state": share.state,
        "description": share.description,
    }
    # The form's what-if: a plan of that one change (not saved), replayed.
    planned = layout.change_share(name=history, share=entry, actor=alice, dry_run=True, run_whatif=True)
    preview = whatif.status(planned.whatif_run)
    assert sweep.finished and preview.finished and not sweep.failed and not preview.failed
    assert sweep.spec["now"] == preview.spec["now"]  # the same window: asked together
    row = sweep.result["rows"][0]
    mine = next(r for r in preview.result["rows"] if r["share"] == history)
    utilisation = preview.result["cluster"][0]
    assert (row["p95_wait_s"], row["p50_wait_s"], row["preemptions"], row["gpu_hours_run"]) == (
        mine["wait_p95_s"][1],
        mine["wait_p50_s"][1],
        mine["preemptions"][1],
        mine["gpu_hours_run"][1],
    )
    assert row["utilisation"] == utilisation["after"]


def test_simulate_variant_counts_the_jobs_its_variant_never_starts(tmp_path, capsys):
    """`python -m quotas.simulate --variant LEND:team-1`: under its table, waits that count the jobs
    that never started, and those jobs in words."""
    import json

    team = sc.Share("team-1", "t1", {"a100": 40})
    other = sc.Share("team-2", "t2", {"a100": 24})
    jobs = [sc.Job(f"big{i}", "team-1", 60 * i, 600, 64, "a100") for i in range(13)]
    nodes = tuple(sc.Node(f"n{i}", "a100", 8) for i in range(8))
    s = sc.Scenario(settings=SETTINGS, nodes=nodes, shares=(team, other), jobs=tuple(jobs))
    path = tmp_path / "s.json"
    path.write_text(json.dumps(s.to_dict()))
    assert simulate.main([str(path), "--variant", "LEND:team-1"]) == 0
    out = capsys.readouterr().out
    assert "counting every job (one that never started waits until the cut)" in out
    assert (
        "never started (LEND:team-1): 13 jobs of team-1 need 64 a100 each: team-1 is LEND with 40 a100" in out
    )
    line = next(x for x in out.splitlines() if x.startswith("  team-1 wait_s: "))
    assert "never started 0 | LEND:team-1: p50 " in line and "never started 13" in line
