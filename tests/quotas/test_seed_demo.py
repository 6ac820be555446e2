from io import StringIO

from django.core.management import call_command

from gpunodes.models import Gpu, Node
from jobs.models import Job, JobEvent
from quotas.choices import Strategy
from quotas.models import Membership, Share, ShareCapacity, Team


def counts():
    return [m.objects.count() for m in (Team, Membership, Share, ShareCapacity, Node, Gpu, Job, JobEvent)]


def test_it_seeds_three_teams_with_every_strategy(db):
    call_command("seed_demo", stdout=StringIO())
    assert Team.objects.count() == 3
    assert set(Share.objects.values_list("strategy", flat=True)) == set(Strategy.values)
    assert Node.objects.count() == 2
    assert Job.objects.count() >= 3


def test_it_seeds_a_small_organisation_tree_the_layout_exports(db):
    from quotas import layout, layoutdoc
    from quotas.models import FairSharing, Group

    call_command("seed_demo", stdout=StringIO())
    assert sorted(Group.objects.values_list("name", "weight", "lend_limit")) == [
        ("infra", 1, -1),
        ("research", 2, 50),
    ]
    assert dict(Share.objects.values_list("name", "group__name")) == {
        "language-research": "research",
        "platform-batch": "infra",
        "vision-prod": "research",
    }
    assert FairSharing.current().fair_share_half_life_s == 86400
    live = layout.load_live().layout
    data, errors = layoutdoc.parse(live.to_data(), now=layout.timezone.now())
    assert errors == {} and data.hash() == live.hash()  # a valid tree, as the layout reads it


def test_it_is_idempotent(db):
    call_command("seed_demo", stdout=StringIO())
    before = counts()
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert counts() == before
    assert "nothing changed" in out.getvalue()


def test_demo_traffic_submits_waves_for_each_strategy(db):
    call_command("seed_demo", stdout=StringIO())
    Job.objects.update(state="SUCCEEDED")  # as if the seeded jobs had run
    before = set(Job.objects.values_list("pk", flat=True))
    out = StringIO()
    call_command("demo_traffic", waves=3, every=0, delay=0, stdout=out)
    new = Job.objects.exclude(pk__in=before)
    assert set(new.values_list("share__name", flat=True)) == {
        "language-research",
        "platform-batch",
        "vision-prod",
    }
    assert new.get(share__name="vision-prod").priority == 50
    assert "submitted job" in out.getvalue()


def test_demo_traffic_skips_a_share_with_work_waiting(db):
    call_command("seed_demo", stdout=StringIO())
    call_command("demo_traffic", waves=1, every=0, delay=0, stdout=StringIO())
    queued = Job.objects.filter(share__name="language-research", state="QUEUED").count()
    call_command("demo_traffic", waves=1, every=0, delay=0, stdout=StringIO())
    assert Job.objects.filter(share__name="language-research", state="QUEUED").count() == max(queued, 2)
