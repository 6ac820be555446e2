"""The what-if and issue 26: the replay's scenario has each share's protection window and each job's
checkpoints as its hosts saw them; the comparison shows lost work per share; a sweep over min_runtime_s
shows the trade-off between thrash (pre-emptions soon after a start, work thrown away) and the owners'
wait for reclaimed GPUs."""

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, Job
from jobs.services import job_submit
from quotas import whatif
from quotas.engine import measures
from quotas.engine import scenario as sc
from tests.web.conftest import logged_in

pytestmark = pytest.mark.django_db


# --- the scenario the replay is built from ------------------------------------------------------------


def test_the_scenario_has_each_shares_window_and_each_jobs_checkpoints(no_messages, bob, vision_share, nodes):
    vision_share.min_runtime_s = 900
    vision_share.save()
    now = timezone.now()
    saver = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"], name="saver")
    plain = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"], name="plain")
    started = now - timedelta(hours=2)
    # saver: 4 checkpoints over 40 min, the last one after it was told to stop (it saves on SIGTERM).
    Attempt.objects.create(
        job=saver,
        number=1,
        state=AttemptState.ENDED,
        outcome=Outcome.PREEMPTED,
        placement=[{"node": "node-1", "gpus": [0]}],
        started_at=started,
        stop_requested_at=started + timedelta(minutes=39),
        last_checkpoint_at=started + timedelta(minutes=40),
        checkpoints=4,
        ended_at=started + timedelta(minutes=40, seconds=5),
    )
    Attempt.objects.create(
        job=plain,
        number=1,
        state=AttemptState.ENDED,
        outcome=Outcome.SUCCEEDED,
        placement=[{"node": "node-2", "gpus": [0]}],
        started_at=started,
        ended_at=started + timedelta(minutes=10),
    )
    Job.objects.filter(pk__in=[saver.pk, plain.pk]).update(state=JobState.SUCCEEDED, attempt_count=1)
    scenario, _, _ = whatif.build_scenario(now=timezone.now())
    share = next(s for s in scenario.shares if s.name == "vision-main")
    assert share.min_runtime_s == 900
    jobs = {j.id: j for j in scenario.jobs}
    assert (jobs[str(saver.pk)].checkpoint_every_s, jobs[str(saver.pk)].checkpoint_on_stop) == (600, True)
    assert (jobs[str(plain.pk)].checkpoint_every_s, jobs[str(plain.pk)].checkpoint_on_stop) == (None, False)
    changed = whatif.with_change(scenario, "vision-main", {"min_runtime_s": 60})
    assert next(s for s in changed.shares if s.name == "vision-main").min_runtime_s == 60


# --- the trade-off, on a small scenario -------------------------------------------------------------------


def thrash() -> sc.Scenario:
    """One 4-GPU node. `owner` (LEND, 4 GPUs) runs a 1-GPU job of 200 s every 300 s; `borrower` (no
    capacity) keeps 4 GPUs busy with long jobs that never checkpoint: each owner job reclaims one, which
    borrows its GPU back when the owner's job ends, only to be reclaimed again 100 s later."""
    jobs = [
        sc.Job(id=f"b{i}", share="borrower", submit_at=0, duration_s=4000, gpus=1, gpu_type="a10g")
        for i in range(4)
    ]
    jobs += [
        sc.Job(id=f"o{i}", share="owner", submit_at=100 + 300 * i, duration_s=200, gpus=1, gpu_type="a10g")
        for i in range(12)
    ]
    return sc.Scenario(
        settings=sc.Settings(tick_s=1, preemption_grace_s=10),
        nodes=(sc.Node(name="n1", gpu_type="a10g", gpus=4),),
        shares=(
            sc.Share(name="owner", team="o", capacity={"a10g": 4}, strategy="LEND"),
            sc.Share(name="borrower", team="b", capacity={}, strategy="LEND_AND_BORROW"),
        ),
        jobs=tuple(jobs),
    )


def test_a_sweep_over_min_runtime_shows_thrash_against_the_owners_wait():
    base = thrash()
    values = [0, 300, 900]
    window = measures.natural_window(base)
    summaries = [
        whatif.replay(whatif.with_change(base, "borrower", {"min_runtime_s": v}), window_s=window)
        for v in values
    ]
    table = whatif.sweep_table(summaries, ["none", "5 min", "15 min"], "borrower")
    early = [r["early_preemptions"] for r in table["rows"]]
    lost = [r["cluster_lost_gpu_hours"] for r in table["rows"]]
    waits = [r["owner_wait_p95_s"] for r in table["rows"]]
    print(f"min_runtime_s {values}: early pre-emptions {early}, lost GPU-h {lost}, owners' p95 wait {waits}")
    # A 15-minute window: no pre-emption within 10 minutes of a start any more (a 5-minute one still
    # lets them come 5 to 10 minutes in) ...
    assert early[0] > early[1] > early[2] == 0
    # ... paid for by the owners, who now wait for the windows (at most the window plus the grace) ...
    assert waits[0] < waits[1] < waits[2] <= 900 + 10 + 1
    # ... and, where jobs never checkpoint, by more work lost: the victims are the older jobs past their
    # windows (README, "Protection windows"). The sweep shows both sides.
    assert lost[0] < lost[2]
    assert table["chart"]["lost_gpu_hours"] == lost and table["chart"]["owner_wait_p95_s"] == waits


def test_the_comparison_shows_lost_work_per_share():
    base = thrash()
    window = measures.natural_window(base)
    before = whatif.replay(base, window_s=window)
    after = whatif.replay(whatif.with_change(base, "borrower", {"min_runtime_s": 900}), window_s=window)
    compared = whatif.compare(before, after, "borrower")
    row = next(r for r in compared["rows"] if r["share"] == "borrower")
    lost_before, lost_after, change = row["lost_gpu_hours"]
    assert lost_before > 0 and change == pytest.approx(lost_after - lost_before) and change != 0
    metrics = {r["metric"]: (r["before"], r["after"]) for r in compared["cluster"]}
    assert metrics["of them within 10 min of their start"][1] == 0
    assert (
        metrics["owners' p95 wait for reclaimed GPUs (s)"][1]
        > metrics["owners' p95 wait for reclaimed GPUs (s)"][0]
    )


# --- the page: the sweep's setting and its input -----------------------------------------------------------


@pytest.fixture
def history(no_messages, db):
    call_command("seed_history", jobs=120, stdout=io.StringIO())
    return "hist-team-1"


@pytest.fixture
def held(monkeypatch):
    asked = []
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: asked.append((run_id, index)))
    return asked


def test_the_page_sweeps_min_runtime_and_draws_its_trade_off(alice, history, held):
    client = logged_in(alice)
    page = client.get(f"/shares/{history}/").content.decode()
    assert 'value="min_runtime_s"' in page
    r = client.post(
        f"/shares/{history}/sweep/",
        {"setting": "min_runtime_s", "values": "0, 600, 1800"},
        HTTP_HX_REQUEST="true",
    )
    assert r.status_code == 200 and len(held) == 3
    run_id = held[0][0]
    assert [v["changes"] for v in whatif.status(run_id).spec["variants"]] == [
        {"min_runtime_s": 0},
        {"min_runtime_s": 600},
        {"min_runtime_s": 1800},
    ]
    for index in range(3):
        whatif.run_part(run_id, index, isolated=False)
    body = client.get(f"/whatif/{run_id}/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-tradeoff="protection"' in body and "owners' p95 wait for reclaimed GPUs" in body
    assert all(label in body for label in ("none", "10 min", "30 min"))


@pytest.mark.parametrize(
    "values, message",
    [
        ("0, 100000", "min_runtime_s is 0 to 86,400 seconds"),
        ("0, -1", "0 or more"),
        ("0, 5m", "whole numbers"),
    ],
)
def test_a_bad_min_runtime_sweep_comes_back_beside_the_field(alice, history, held, values, message):
    client = logged_in(alice)
    r = client.post(
        f"/shares/{history}/sweep/", {"setting": "min_runtime_s", "values": values}, HTTP_HX_REQUEST="true"
    )
    assert r.status_code == 400 and not held and message in r.content.decode()


def test_the_preview_replays_the_forms_protection_window(alice, history, held):
    from quotas.models import Share

    share = Share.objects.select_related("team").get(name=history)
    data = {
        "name": share.name,
        "team": share.team.slug,
        "strategy": share.strategy,
        "borrow_limit": share.borrow_limit,
        "state": share.state,
        "min_runtime_s": "1200",
        "cap_v100": share.capacity_map()["v100"],
    }
    r = logged_in(alice).post(f"/shares/{history}/whatif/", data, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    spec = whatif.status(held[0][0]).spec
    # The preview is a plan of the form's change (quotas.layout): its layout carries the window.
    planned = spec["variants"][1]["changes"]["layout"]["shares"]
    assert next(s for s in planned if s["name"] == history)["min_runtime_s"] == 1200
