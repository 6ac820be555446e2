"""With real processes: a temporary layout change goes back at its time, by the beat task on the control
worker, with nobody asking (a shortened window: it ends 4 s after it is applied, beat looks every second);
a second one whose field was changed again meanwhile is left as the later change set it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from quotas import layout
from quotas.models import LayoutVersion, Share, TemporaryChange, TemporaryState
from tests.live.conftest import wait_for
from tests.live.test_cluster import member, share

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def apply(changes: dict, until=None):
    data = layout.load_live().layout.to_data()
    for name, values in changes.items():
        entry = next(s for s in data["shares"] if s["name"] == name)
        entry.update(values)
        if until is not None:
            entry["until"] = until.isoformat()
    return layout.apply(
        plan_id=layout.plan(source=data, run_whatif=False).pk, overcommit_ok=True
    )  # the cluster has no a10g node up yet


def test_the_control_side_sets_a_temporary_change_back_at_its_time(cluster, django_user_model):
    team, _ = member(django_user_model, "tmp")
    share(team, "tmp-train", 2)
    share(team, "tmp-other", 2)
    cluster.env["LAYOUT_REVERT_INTERVAL_S"] = "1"
    cluster.start_control_plane()
    until = timezone.now() + timedelta(seconds=4)
    apply({"tmp-train": {"capacity": {"a10g": 6}}, "tmp-other": {"capacity": {"a10g": 5}}}, until=until)
    apply({"tmp-other": {"capacity": {"a10g": 3}}})  # later: never fought
    assert Share.objects.get(name="tmp-train").capacity_map() == {"a10g": 6}

    def done():
        return not TemporaryChange.objects.filter(state=TemporaryState.PENDING).exists()

    wait_for(done, 30, what="the temporary changes to end (beat every 1 s)")
    change = TemporaryChange.objects.get(share_name="tmp-train")
    # `until` is kept to the second (layoutdoc.parse_until): the revert is due from the stored time.
    assert change.until == until.replace(microsecond=0)
    assert change.until <= change.done_at < change.until + timedelta(seconds=10)
    assert Share.objects.get(name="tmp-train").capacity_map() == {"a10g": 2}
    assert Share.objects.get(name="tmp-other").capacity_map() == {"a10g": 3}
    states = dict(TemporaryChange.objects.values_list("share_name", "state"))
    assert states == {"tmp-train": TemporaryState.REVERTED, "tmp-other": TemporaryState.SKIPPED}
    assert list(LayoutVersion.objects.order_by("number").values_list("kind", flat=True)) == [
        "apply",
        "apply",
        "revert",
    ]
