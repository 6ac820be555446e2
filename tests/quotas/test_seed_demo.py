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


def test_it_is_idempotent(db):
    call_command("seed_demo", stdout=StringIO())
    before = counts()
    out = StringIO()
    call_command("seed_demo", stdout=out)
    assert counts() == before
    assert "nothing changed" in out.getvalue()
