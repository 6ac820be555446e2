"""The what-if replay on a young cluster: the window starts at the first submission, not 7 days back,
so the utilisation it shows is of time the cluster lived."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job
from quotas import whatif
from tests.web.conftest import submit


@pytest.mark.django_db
def test_the_window_of_a_young_cluster_starts_at_its_first_submission(no_messages, bob, vision_share, nodes):
    now = timezone.now()
    first = submit(bob, vision_share, gpus=4, max_runtime_s=3600)
    Job.objects.filter(pk=first.pk).update(submitted_at=now - timedelta(hours=2))
    submit(bob, vision_share, gpus=4, max_runtime_s=3600)
    Job.objects.exclude(pk=first.pk).update(submitted_at=now - timedelta(hours=1))

    scenario, left_out, start = whatif.build_scenario(now=now)
    assert start == now - timedelta(hours=2)
    assert [j.submit_at for j in scenario.jobs] == [0, 3600]

    preview = whatif.preview(share=vision_share.name, changes={}, now=now)
    assert (preview.window_start, preview.window_end) == (now - timedelta(hours=2), now)
    utilisation = next(
        r for r in preview.cluster if r["metric"] == "utilisation over the replayed window (%)"
    )
    # 2 jobs × 4 GPUs × 1 h on 8 GPUs over the 2 h they took: 50 %, not the 1.2 % of an idle week.
    assert utilisation["before"] == pytest.approx(50, abs=1)


@pytest.mark.django_db
def test_an_empty_cluster_keeps_the_7_day_window(no_messages, nodes):
    now = timezone.now()
    _, _, start = whatif.build_scenario(now=now)
    assert start == now - whatif.WINDOW
