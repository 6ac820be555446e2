"""Usage history: a sample per share and type every minute, thinned to 15-minute means after a day,
pruned after 90 days; the beat schedules both."""

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings

from quotas import tasks, usage
from quotas.models import UsageSample
from tests.api.conftest import run
from tests.web.conftest import submit

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_it_samples_every_share_and_type(bob, vision_share, language_share, nodes):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    submit(bob, vision_share, gpus=1)
    assert usage.sample(NOW) == 2
    v = UsageSample.objects.get(share=vision_share)
    assert (v.capacity, v.own, v.borrowed, v.running_jobs, v.queued_jobs, v.queued_gpus) == (4, 4, 2, 2, 1, 1)
    assert v.resolution_s == 60 and v.at == NOW
    lang = UsageSample.objects.get(share=language_share)
    # 2 borrowed, drawn from language's 2 idle GPUs and the 2 unassigned ones in proportion.
    assert lang.lent == 1 and lang.own == 0


def _fill(share, start, minutes, own=lambda i: i % 4):
    UsageSample.objects.bulk_create(
        UsageSample(at=start + timedelta(minutes=i), share=share, gpu_type="a10g", capacity=4, own=own(i))
        for i in range(minutes)
    )


def test_it_thins_samples_older_than_a_day_to_15_minute_means(vision_share):
    old = NOW - timedelta(days=2)
    _fill(vision_share, old, 60)  # an hour of minute samples two days ago
    _fill(vision_share, NOW - timedelta(hours=2), 10)  # fresh ones stay
    removed = usage.downsample(NOW)
    assert removed == 60
    thinned = list(UsageSample.objects.filter(at__lt=NOW - timedelta(days=1)).order_by("at"))
    assert len(thinned) == 4 and {s.resolution_s for s in thinned} == {900}
    assert [s.at for s in thinned] == [old + timedelta(minutes=15 * i) for i in range(4)]
    assert thinned[0].own == pytest.approx(sum(i % 4 for i in range(15)) / 15)
    assert UsageSample.objects.filter(resolution_s=60).count() == 10
    assert usage.downsample(NOW) == 0  # again: nothing changes


def test_it_prunes_after_90_days(vision_share):
    _fill(vision_share, NOW - timedelta(days=91), 3)
    _fill(vision_share, NOW - timedelta(days=89), 2)
    assert usage.prune(NOW) == 3
    assert UsageSample.objects.count() == 2


def test_history_sums_types_per_share(vision_share, language_share):
    for share, used in ((vision_share, 3), (language_share, 1)):
        UsageSample.objects.create(
            at=NOW - timedelta(hours=1), share=share, gpu_type="a10g", own=used, borrowed=1
        )
        UsageSample.objects.create(at=NOW - timedelta(hours=1), share=share, gpu_type="h100", own=2)
    UsageSample.objects.create(at=NOW - timedelta(hours=30), share=vision_share, gpu_type="a10g", own=9)
    h = usage.history(hours=24, now=NOW)
    assert len(h["times"]) == 1
    assert h["series"] == {"language-main": [4.0], "vision-main": [6.0]}


def test_the_tasks_run_and_are_scheduled(vision_share, nodes):
    assert tasks.sample_usage() == 1
    assert tasks.compact_usage() == {"downsampled": 0, "pruned": 0}
    beat = {v["task"]: v["schedule"] for v in settings.CELERY_BEAT_SCHEDULE.values()}
    assert beat["quotas.tasks.sample_usage"] == 60.0
    assert "quotas.tasks.compact_usage" in beat


def test_a_young_clusters_history_starts_at_its_first_sample(vision_share):
    for minutes in (20, 10, 0):
        UsageSample.objects.create(
            at=NOW - timedelta(minutes=minutes), share=vision_share, gpu_type="a10g", own=1
        )
    h = usage.history(hours=24, now=NOW)
    assert h["since"] == NOW - timedelta(minutes=20)
    start = datetime.fromisoformat(h["start"])
    assert NOW - timedelta(minutes=22) < start < NOW - timedelta(minutes=20)  # a little room before it


def test_a_first_sample_a_minute_ago_still_shows_ten_minutes(vision_share):
    UsageSample.objects.create(at=NOW - timedelta(minutes=1), share=vision_share, gpu_type="a10g", own=1)
    start = datetime.fromisoformat(usage.history(hours=24, now=NOW)["start"])
    assert NOW - start == usage.HISTORY_MIN_SPAN * 1.05


def test_a_cluster_sampled_all_day_shows_the_whole_day(vision_share):
    for hours in (23.9, 1):
        UsageSample.objects.create(
            at=NOW - timedelta(hours=hours), share=vision_share, gpu_type="a10g", own=1
        )
    h = usage.history(hours=24, now=NOW)
    assert h["since"] is None and datetime.fromisoformat(h["start"]) == NOW - timedelta(hours=24)
