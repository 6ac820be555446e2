"""Changes that end by themselves (issue 28): a plan's `until:` on a share sets what the plan changed of
it back at that time, once, recorded as a version; a field changed again meanwhile is left as it is
(a revert never fights a later change), and the outcome says so. In the what-if the same change is an
update_share event and its revert, the simulator's own format."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from config.celery import app
from quotas import layout, whatif
from quotas.engine import scenario as sc
from quotas.engine import simulate
from quotas.models import AuditEntry, LayoutVersion, Share, TemporaryChange, TemporaryState
from tests.conftest import make_share

pytestmark = pytest.mark.django_db


def live_data():
    return layout.load_live().layout.to_data()


def entry(data, name):
    return next(s for s in data["shares"] if s["name"] == name)


# No node is READY here: every capacity over-commits, which these tests are not about (overcommit_ok).
def apply_change(share_name, until=None, actor=None, **values):
    data = live_data()
    e = entry(data, share_name)
    e.update(values)
    if until is not None:
        e["until"] = until
    return layout.apply(
        overcommit_ok=True, plan_id=layout.plan(source=data, actor=actor, run_whatif=False).pk, actor=actor
    )


@pytest.fixture
def train(no_messages, vision):
    return make_share(vision, "vision-train", capacity={"a100": 32, "a10g": 2})


def test_a_temporary_change_goes_back_at_its_time_once_as_a_version(train, alice):
    applied = apply_change("vision-train", until="2d", actor=alice, capacity={"a100": 48, "a10g": 2})
    [change] = TemporaryChange.objects.all()
    assert change.fields == {"capacity.a100": [32, 48]} and change.version == applied.version
    assert abs(change.until - (timezone.now() + timedelta(days=2))) < timedelta(minutes=1)
    assert layout.revert_due(now=change.until - timedelta(seconds=1)) == []  # not yet
    [done] = layout.revert_due(now=change.until)
    assert done.state == TemporaryState.REVERTED and Share.objects.get(
        name="vision-train"
    ).capacity_map() == {
        "a100": 32,
        "a10g": 2,
    }
    version = LayoutVersion.objects.get(number=2)
    assert (version.kind, version.actor_name, done.revert_version) == ("revert", "", version)
    assert version.note == "the temporary change of version 1 to vision-train ended"
    assert done.outcome.startswith("set back at ") and done.outcome.endswith(": capacity.a100 → 32")
    entry = AuditEntry.objects.get(object_type="layout", object_id="2")
    assert entry.action == "revert" and entry.changes[0]["field"] == "capacity.a100"
    # Once: a second run, or the same change asked again, does nothing.
    assert layout.revert_due(now=change.until + timedelta(hours=1)) == []
    assert layout.revert(change_id=change.pk, now=change.until) is None
    assert LayoutVersion.objects.count() == 2


def test_a_revert_never_fights_a_later_change(train, alice):
    apply_change("vision-train", until="2d", capacity={"a100": 48, "a10g": 2}, description="deadline")
    apply_change("vision-train", capacity={"a100": 40, "a10g": 2})  # a later change of the same field
    [change] = TemporaryChange.objects.all()
    [done] = layout.revert_due(now=change.until)
    share = Share.objects.get(name="vision-train")
    assert share.capacity_map()["a100"] == 40  # left as the later change set it
    assert share.description == ""  # this field still held the temporary value: set back
    assert done.state == TemporaryState.PARTLY
    assert (
        "capacity.a100 is 40 now, not the 48 this change set: changed again meanwhile, left as it is"
        in done.outcome
    )


def test_a_revert_with_nothing_left_to_set_back_is_skipped_and_says_why(train, alice):
    apply_change("vision-train", until="1d", strategy="RESERVE")
    apply_change("vision-train", strategy="LEND")
    [change] = TemporaryChange.objects.all()
    [done] = layout.revert_due(now=change.until)
    assert done.state == TemporaryState.SKIPPED and done.revert_version is None
    assert done.outcome == (
        "nothing set back: strategy is LEND now, not the RESERVE this change set: changed again meanwhile, "
        "left as it is"
    )
    assert LayoutVersion.objects.count() == 2
    assert AuditEntry.objects.filter(object_type="layout", action="revert").get().after == {
        "outcome": done.outcome
    }


def test_a_revert_that_would_give_an_invalid_layout_is_skipped(no_messages, vision):
    make_share(vision, "lender", capacity={"a10g": 2}, strategy="LEND")
    apply_change("lender", until="1d", strategy="LEND_AND_BORROW")
    apply_change("lender", borrow_limit=50)  # later: a borrow limit, which only LEND_AND_BORROW may have
    [change] = TemporaryChange.objects.all()
    [done] = layout.revert_due(now=change.until)
    assert done.state == TemporaryState.SKIPPED
    assert done.outcome.startswith("nothing set back: the layout it would give is not valid (")
    assert "only a LEND_AND_BORROW share borrows" in done.outcome
    assert Share.objects.get(name="lender").strategy == "LEND_AND_BORROW"


def test_a_share_removed_meanwhile_skips_its_revert(train):
    apply_change("vision-train", until="1d", state="DISABLED")
    [change] = TemporaryChange.objects.all()
    data = live_data()
    data["shares"] = [s for s in data["shares"] if s["name"] != "vision-train"]
    layout.apply(overcommit_ok=True, plan_id=layout.plan(source=data, run_whatif=False).pk)
    [done] = layout.revert_due(now=change.until)
    assert (done.state, done.outcome) == (TemporaryState.SKIPPED, "nothing set back: the share was removed")


def test_a_renamed_share_is_set_back_under_its_new_name(train):
    apply_change("vision-train", until="1d", capacity={"a100": 48, "a10g": 2})
    apply_change("vision-train", name="vision-big", previous_name="vision-train")
    [change] = TemporaryChange.objects.all()
    [done] = layout.revert_due(now=change.until)
    assert done.state == TemporaryState.REVERTED
    assert Share.objects.get(name="vision-big").capacity_map() == {"a100": 32, "a10g": 2}


def test_a_share_added_until_a_time_stops_taking_work_then(no_messages, vision):
    data = live_data()
    data["shares"].append({"name": "audio", "team": "vision", "capacity": {"a10g": 4}, "until": "30d"})
    planned = layout.plan(source=data, run_whatif=False)
    assert planned.temporary[0]["fields"] == {"capacity.a10g": [0, 4], "state": ["DISABLED", "ENABLED"]}
    layout.apply(overcommit_ok=True, plan_id=planned.pk)
    [done] = layout.revert_due(now=timezone.now() + timedelta(days=31))
    audio = Share.objects.get(name="audio")
    assert done.state == TemporaryState.REVERTED and audio.state == "DISABLED" and audio.capacity_map() == {}


def test_the_beat_task_sets_a_change_back_at_its_time_celery_eager(train, celery_eager):
    """A shortened window: the change ends 2 s after it is applied; the task (eager) sets it back."""
    data = live_data()
    entry(data, "vision-train")["capacity"] = {"a100": 48, "a10g": 2}
    entry(data, "vision-train")["until"] = (timezone.now() + timedelta(seconds=2)).isoformat()
    layout.apply(overcommit_ok=True, plan_id=layout.plan(source=data, run_whatif=False).pk)
    task = app.tasks["quotas.tasks.revert_temporary_changes"]
    assert task.apply().get() == 0  # not yet
    time.sleep(2.1)
    assert task.apply().get() == 1
    assert task.apply().get() == 0  # once
    assert Share.objects.get(name="vision-train").capacity_map()["a100"] == 32


def test_the_revert_task_runs_on_beat(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["revert-temporary-changes"]
    assert entry["task"] == "quotas.tasks.revert_temporary_changes"
    assert entry["schedule"] == settings.LAYOUT_REVERT_INTERVAL_S


def test_a_plan_with_an_until_that_changes_nothing_warns_and_keeps_nothing(train):
    data = live_data()
    entry(data, "vision-train")["until"] = "1d"
    planned = layout.plan(source=data, run_whatif=False)
    assert planned.diff == [] and planned.temporary == []
    assert "this plan changes nothing of vision-train, so nothing goes back" in planned.effects["warnings"][0]


def test_a_plan_says_when_it_changes_a_field_a_pending_revert_will_then_leave(train):
    apply_change("vision-train", until="2d", capacity={"a100": 48, "a10g": 2})
    data = live_data()
    entry(data, "vision-train")["capacity"] = {"a100": 40, "a10g": 2}
    [warning] = layout.plan(source=data, run_whatif=False).effects["warnings"]
    assert warning.startswith("vision-train has a temporary change until ")
    assert warning.endswith("this plan changes capacity.a100, so that revert will leave it as this plan sets")


def test_an_apply_after_its_until_passed_is_refused(train):
    from jobs.services import Conflict

    data = live_data()
    entry(data, "vision-train")["capacity"] = {"a100": 48}
    entry(data, "vision-train")["until"] = "1m"
    planned = layout.plan(source=data, run_whatif=False)
    with pytest.raises(Conflict, match="which has passed: nothing was applied"):
        layout.apply(overcommit_ok=True, plan_id=planned.pk, now=timezone.now() + timedelta(minutes=2))


def test_in_the_whatif_a_temporary_change_is_an_update_share_event_and_its_revert(train):
    """The simulator's own event format: the planned value from the start, an update_share back to the
    old one as long into the replay as the change lasts from now."""
    now = timezone.now()
    data = live_data()
    entry(data, "vision-train")["capacity"] = {"a100": 48, "a10g": 2}
    entry(data, "vision-train")["until"] = "1d"
    planned = layout.plan(source=data, run_whatif=False, now=now)
    live = layout.load_live()
    target, _ = layout.check(planned.document, now=now, live=live)
    variant = layout.whatif_variant(live, target, planned.temporary, now)
    base = sc.Scenario(
        settings=sc.Settings(until_s=3 * 86400),
        nodes=(sc.Node("n1", "a100", 8),),
        shares=(sc.Share("vision-train", "vision", {"a100": 32, "a10g": 2}),),
        jobs=(sc.Job("j1", "vision-train", 0, 60, 1, "a100"),),
    )
    scenario, dropped = whatif.with_layout(base, variant)
    assert dropped == 0
    assert scenario.shares[0].capacity == {"a100": 48, "a10g": 2}
    [event] = scenario.events
    assert (event.at, event.kind, event.share, dict(event.set)["capacity"]) == (
        86400,
        sc.UPDATE_SHARE,
        "vision-train",
        {"a100": 32, "a10g": 2},
    )
    # It is the scenario format itself: it round-trips through the parser, and the replay applies it.
    again = sc.parse(scenario.to_dict())
    assert again.events[0].set["capacity"] == {"a100": 32, "a10g": 2}
    timeline = simulate.simulate(again).timeline
    times, values = timeline.series[("vision-train", "a100", "capacity")]
    assert list(zip(times, values, strict=True)) == [(0, 48), (86400, 32)]


def test_the_whatifs_as_is_has_the_pending_reverts_of_changes_applied_already(train, monkeypatch):
    """A change applied with an until goes back by itself: the "as is" replay kept it for the whole week
    (issue 42.6). Every variant gets the revert, as the revert itself does: a field only if it still
    holds the value the change gave it."""
    apply_change("vision-train", until="1d", capacity={"a100": 48, "a10g": 2})
    now = timezone.now()
    [pending] = whatif.pending_reverts(now)
    assert pending["share"] == "vision-train" and pending["fields"] == {"capacity.a100": [32, 48]}
    assert abs(pending["after_s"] - 86400) < 120
    base = sc.Scenario(
        settings=sc.Settings(until_s=3 * 86400),
        nodes=(sc.Node("n1", "a100", 8),),
        shares=(sc.Share("vision-train", "vision", {"a100": 48, "a10g": 2}),),
        jobs=(sc.Job("j1", "vision-train", 0, 60, 1, "a100"),),
    )
    [event] = whatif.with_pending_reverts(base, [pending]).events
    assert (event.kind, event.share, event.set) == (
        sc.UPDATE_SHARE,
        "vision-train",
        {"capacity": {"a100": 32, "a10g": 2}},
    )
    # A variant that changes the field again (a plan, a preview) keeps its own value: nothing to set back.
    changed = whatif.with_change(base, "vision-train", {"capacity": {"a100": 40, "a10g": 2}})
    assert whatif.with_pending_reverts(changed, [pending]).events == ()
    # The as-is replay of a run has it, and the run says so beside its figures.
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: None)  # no worker: run it here
    run_id = whatif.start_preview(share="vision-train", changes={"strategy": "RESERVE", "borrow_limit": -1})
    whatif.run_part(run_id, 0, isolated=False)
    assert [r["share"] for r in whatif.status(run_id).window["reverts"]] == ["vision-train"]
