"""seed_history: a week of finished jobs on its own hist- cluster, safe beside a demo's data."""

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from gpunodes.models import Node
from jobs.models import Attempt, Job
from quotas import whatif

pytestmark = pytest.mark.django_db


def seed(**kwargs):
    call_command("seed_history", stdout=io.StringIO(), **kwargs)


def test_it_seeds_a_week_of_finished_jobs_that_the_whatif_replays(no_messages, vision_share, nodes, bob):
    seed(jobs=150)
    jobs = Job.objects.filter(share__name__startswith="hist-")
    assert jobs.count() == 150 and not jobs.exclude(state__in=["SUCCEEDED", "CANCELLED"]).exists()
    first = jobs.order_by("submitted_at").first().submitted_at
    assert timezone.now() - timedelta(days=7) <= first < timezone.now() - timedelta(days=6)
    assert Attempt.objects.filter(job__in=jobs).count() == jobs.filter(state="SUCCEEDED").count()
    assert set(Node.objects.filter(name__startswith="hist-").values_list("state", flat=True)) == {"LOST"}
    scenario, left_out, _ = whatif.build_scenario()
    assert len([j for j in scenario.jobs if j.share.startswith("hist-")]) == 150 and left_out == 0
    assert vision_share.jobs.count() == 0 and Node.objects.filter(name__startswith="node-").count() == 2


def test_it_refuses_to_seed_twice_unless_asked_to_replace(no_messages):
    seed(jobs=40)
    with pytest.raises(CommandError, match="--replace"):
        seed(jobs=40)
    seed(jobs=60, replace=True)
    assert Job.objects.filter(share__name__startswith="hist-").count() == 60


def test_it_refuses_a_gpu_type_that_other_nodes_have(no_messages, nodes):
    with pytest.raises(CommandError, match="another --gpu-type"):
        seed(jobs=40, gpu_type="a10g")
    assert not Job.objects.exists()


def test_remove_deletes_exactly_what_it_seeded_and_the_overcommit_goes_with_it(
    no_messages, vision_share, nodes, bob
):
    from jobs.services import job_submit
    from quotas import usage
    from quotas.models import Share, Team

    job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    out = io.StringIO()
    call_command("seed_history", jobs=80, stdout=out)
    assert "until `python manage.py seed_history --remove` deletes them" in out.getvalue()
    assert usage.cluster_picture().overcommitted == ["v100"]  # its shares hold GPUs no READY node has
    out = io.StringIO()
    call_command("seed_history", remove=True, stdout=out)
    assert out.getvalue().startswith("removed the seeded history: 80 jobs, ")
    assert not Share.objects.filter(name__startswith="hist-").exists()
    assert not Team.objects.filter(slug__startswith="hist-").exists()
    assert not Node.objects.filter(name__startswith="hist-").exists()
    assert usage.cluster_picture().overcommitted == []
    # The rest is as it was.
    assert vision_share.jobs.count() == 1 and Node.objects.count() == 2
    with pytest.raises(CommandError, match="nothing to remove"):
        call_command("seed_history", remove=True, stdout=io.StringIO())
