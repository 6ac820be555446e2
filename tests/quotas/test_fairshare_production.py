"""Production feeds the organisation tree to the engine (issue 37, item 2's wiring): the pass's snapshot
carries the groups, the shares' groups and weights, the fair-sharing settings and the stored history;
each pass advances the history with the engine's accumulator; a plan that lowers a group's borrow limit
names the borrowed jobs it leaves uncovered."""

from datetime import timedelta

import pytest
from django.utils import timezone

from quotas import fairshare, layout, scheduler
from quotas.engine.tree import GroupSpec
from quotas.models import FairShareHistory
from tests import org_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(no_messages, alice, bob, charlie, vision_share, language_share, nodes):
    return org_world.build(alice, bob, vision_share, language_share, nodes, half_life_s=3600)


def test_the_snapshot_carries_the_tree_its_weights_and_settings(world):
    snap = scheduler.load_snapshot().snapshot
    assert snap.groups == (GroupSpec("lang"), GroupSpec("research", borrow_limit=50))
    vision = next(s for s in snap.shares if s.name == "vision-main")
    assert (vision.group, vision.weight) == ("research", 2)
    assert snap.fair_share_half_life_s == 3600 and snap.fair_reclaim is False


def test_each_pass_advances_the_stored_history(world):
    t0 = timezone.now()
    first = scheduler.load_snapshot(t0).snapshot
    assert first.history == {}
    fairshare.advance(first, t0)
    # an hour later (one half-life) of borrowing 2 a10g: history 2 x (1 - 1/2) = 1
    later = t0 + timedelta(hours=1)
    values = fairshare.advance(scheduler.load_snapshot(later).snapshot, later)
    assert values[("research", "a10g")] == pytest.approx(1.0)
    assert values[("vision-main", "a10g")] == pytest.approx(1.0)
    assert ("lang", "a10g") not in values  # it lends; it takes nothing from outside
    assert scheduler.load_snapshot(later).snapshot.history[("research", "a10g")] == pytest.approx(1.0)


def test_the_pass_itself_keeps_the_history(world):
    scheduler.run_pass("test")
    data = FairShareHistory.objects.get(pk=fairshare.HISTORY_PK).data
    assert data["half_life_s"] == 3600 and data["at"] is not None


def test_without_a_half_life_no_history_is_kept(
    no_messages, alice, bob, charlie, vision_share, language_share, nodes
):
    org_world.build(alice, bob, vision_share, language_share, nodes)
    scheduler.run_pass("test")
    assert not FairShareHistory.objects.exists()
    assert scheduler.load_snapshot().snapshot.history == {}


def test_setting_the_half_life_to_0_drops_the_stored_history(world, alice):
    scheduler.run_pass("test")
    assert FairShareHistory.objects.exists()
    data = layout.load_live().layout.to_data()
    data.pop("settings")
    layout.apply(plan_id=layout.plan(source=data, actor=alice, run_whatif=False).pk, actor=alice)
    assert not FairShareHistory.objects.exists()


def test_a_lowered_group_limit_names_the_borrowed_jobs_it_leaves_uncovered(world, alice):
    data = layout.load_live().layout.to_data()
    next(g for g in data["groups"] if g["name"] == "research")["borrow_limit"] = 0
    planned = layout.plan(source=data, actor=alice, run_whatif=False)
    [uncovered] = planned.effects["uncovered"]
    assert (uncovered["group"], uncovered["gpu_type"], uncovered["shortfall"]) == ("research", "a10g", 2)
    assert uncovered["jobs"] == [world["borrowed"].pk]
    assert uncovered["words"] == (
        f"group research may take 0 a10g from outside: 2 taken, 2 uncovered; its borrowed jobs (job "
        f"{world['borrowed'].pk}) go on, no new borrowing draws on that shortfall, and owners take those "
        "GPUs back first"
    )
    # a limit raised leaves nothing uncovered
    next(g for g in data["groups"] if g["name"] == "research")["borrow_limit"] = 100
    assert layout.plan(source=data, actor=alice, run_whatif=False).effects["uncovered"] == []


def test_a_tree_broken_outside_the_layout_schedules_flat_and_says_why(world, vision, caplog):
    from quotas.models import Share

    # The Django admin can name a share like a group; the layout would have refused it.
    Share.objects.create(team=vision, name="research")
    snap = scheduler.load_snapshot().snapshot
    assert snap.groups == () and all(s.group is None for s in snap.shares)
    assert "the organisation tree in the database is not valid" in caplog.text
    scheduler.run_pass("test")  # the pass goes on


def test_the_organisation_reads_the_stored_history_into_values_and_words(world):
    from quotas import organisation

    t0 = timezone.now()
    fairshare.advance(scheduler.load_snapshot(t0).snapshot, t0)
    later = t0 + timedelta(hours=1)
    fairshare.advance(scheduler.load_snapshot(later).snapshot, later)
    org = organisation.load(now=later)
    research = org.find("research", "a10g")
    assert research.history == pytest.approx(1.0)
    assert research.fair_share_value == pytest.approx((2 + 1.0) / (1 * 4))
    assert research.parts == "(2 taken + 1.0 history) ÷ (weight 1 × 4 capacity) = 0.75"
    vision = org.find("vision-main", "a10g")
    assert organisation.fair_part_words(org, vision, borrowed_day=2.0) == (
        "your fair part of idle a10g now is 4 GPUs: weight 2 × 4 a10g of capacity = 8 of 8 among the "
        "borrowers that wait; borrowed 2 a10g over the last day (history 1.0)"
    )


def test_a_share_without_capacity_of_the_type_counts_as_1_in_its_fair_part_words(world):
    from dataclasses import replace

    from quotas import organisation

    org = organisation.load()
    vision = org.find("vision-main", "a10g")
    vision.row = replace(vision.row, capacity=0, weight=1.5, fair_weight=1.5, competing_total_fair_weight=3.5)
    assert organisation.fair_part_words(org, vision).startswith(
        "your fair part of idle a10g now is 4 GPUs: weight 1.5 × 1 (no a10g of its own) = 1.5 of 3.5 among "
        "the borrowers that wait"
    )


def test_borrowed_over_the_last_day_is_the_days_average_from_the_usage_samples(world, vision_share):
    from quotas import organisation
    from quotas.models import UsageSample

    now = timezone.now()
    for minute in range(120):  # 4 GPUs borrowed for 2 hours: 8 GPU-hours, 1/3 on average over the day
        UsageSample.objects.create(
            at=now - timedelta(minutes=minute + 1), share=vision_share, gpu_type="a10g", borrowed=4, own=4
        )
    UsageSample.objects.create(at=now - timedelta(days=2), share=vision_share, gpu_type="a10g", borrowed=8)
    day = organisation.borrowed_last_day(["vision-main"], now=now)
    assert day == {("vision-main", "a10g"): pytest.approx(1 / 3)}
    org = organisation.load()
    words = organisation.fair_part_words(org, org.find("vision-main", "a10g"), day[("vision-main", "a10g")])
    assert (
        "; borrowed 0.2 a10g over the last day" in words or "; borrowed 0.3 a10g over the last day" in words
    )


def test_the_snapshot_counts_the_fair_reclaims_of_each_running_job(world):
    """Fair reclaim's bound per job (quotas/engine/fairshare.py FAIR_RECLAIM_MAX_PER_JOB) reads how many
    earlier attempts of the job a fair reclaim pre-empted: other pre-emptions do not count, and with fair
    reclaim off the pass does not count at all."""
    from jobs.choices import AttemptState, Outcome, PreemptionReason
    from jobs.models import Attempt
    from quotas.models import FairSharing

    borrowed = world["borrowed"]
    for number, reason in (
        (10, PreemptionReason.FAIR_SHARE),
        (11, PreemptionReason.RECLAIM),
        (12, "FAIR_SHARE"),
    ):
        Attempt.objects.create(
            job=borrowed,
            number=number,
            state=AttemptState.ENDED,
            outcome=Outcome.PREEMPTED,
            preemption_reason=reason,
            ended_at=timezone.now(),
        )

    def counts():
        return {r.job_id: r.fair_reclaims for r in scheduler.load_snapshot().snapshot.running}

    assert counts() == {world["own"].pk: 0, borrowed.pk: 0}  # fair reclaim off: not counted
    FairSharing.objects.update_or_create(pk=1, defaults={"fair_reclaim": True})
    assert counts() == {world["own"].pk: 0, borrowed.pk: 2}


def test_the_snapshot_counts_the_fair_reclaims_of_each_queued_job(world):
    """The forecast's replay gives a queued job's next attempt its count (rule 11's bound per job), so
    the snapshot carries it for queued jobs too, in the same query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.choices import AttemptState, Outcome, PreemptionReason
    from jobs.models import Attempt
    from quotas.models import FairSharing

    waiting = world["waiting"]
    for number in (1, 2, 3):
        Attempt.objects.create(
            job=waiting,
            number=number,
            state=AttemptState.ENDED,
            outcome=Outcome.PREEMPTED,
            preemption_reason=PreemptionReason.FAIR_SHARE,
            ended_at=timezone.now(),
        )

    def counts():
        return {q.job_id: q.fair_reclaims for q in scheduler.load_snapshot().snapshot.queued}

    assert counts()[waiting.pk] == 0  # fair reclaim off: not counted
    FairSharing.objects.update_or_create(pk=1, defaults={"fair_reclaim": True})
    with CaptureQueriesContext(connection) as ctx:
        assert counts()[waiting.pk] == 3
    assert sum("preemption_reason" in q["sql"] for q in ctx.captured_queries) == 1
