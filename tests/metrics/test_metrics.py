"""/metrics: who may read it, what it says about known data, and that a scrape costs a fixed number of
queries however many jobs there are."""

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from gpunodes.models import Node
from quotas.metrics import render

from .conftest import submit

TOKEN = "s3cret-metrics-token"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(data, name, **labels):
    return data[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def scraped(cluster):
    return samples(render().decode())


# -- protection -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_is_off_without_a_token_or_allow_list(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = "", []
    r = Client().get("/metrics")
    assert r.status_code == 403
    assert b"METRICS_TOKEN" in r.content


@pytest.mark.django_db
def test_it_accepts_the_bearer_token(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, []
    r = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain; version=")
    assert b"gpuquota_pass_duration_seconds_count" in r.content


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["", "Bearer wrong", f"Token {TOKEN}", TOKEN])
def test_it_rejects_a_missing_or_wrong_token(settings, header):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, []
    r = Client().get("/metrics", headers={"Authorization": header} if header else {})
    assert r.status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("allowed", "remote", "status"),
    [
        (["127.0.0.1"], "127.0.0.1", 200),
        (["10.0.0.0/8"], "10.1.2.3", 200),
        (["10.0.0.0/8", "::1"], "::1", 200),
        (["10.0.0.0/8"], "192.168.1.1", 403),
    ],
)
def test_it_allows_listed_addresses(settings, allowed, remote, status):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = "", allowed
    assert Client(REMOTE_ADDR=remote).get("/metrics").status_code == status


@pytest.mark.django_db
def test_a_token_also_works_from_an_unlisted_address(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, ["10.0.0.0/8"]
    c = Client(REMOTE_ADDR="192.168.1.1")
    assert c.get("/metrics").status_code == 403
    assert c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


@pytest.mark.django_db
def test_it_rejects_post(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = "", ["127.0.0.1"]
    assert Client().post("/metrics").status_code == 405


# -- values -------------------------------------------------------------------------------------------


def test_it_reports_share_accounting_as_the_policy_does(scraped):
    assert value(scraped, "gpuquota_share_capacity_gpus", share="vision-main", gpu_type="a10g") == 4
    assert value(scraped, "gpuquota_share_own_gpus", share="vision-main", gpu_type="a10g") == 4
    assert value(scraped, "gpuquota_share_borrowed_gpus", share="vision-main", gpu_type="a10g") == 2
    assert value(scraped, "gpuquota_share_lent_gpus", share="vision-main", gpu_type="a10g") == 0
    # 2 borrowed GPUs drawn from 4 idle-lendable: language's 2 and the unassigned pool's 2, half each.
    assert value(scraped, "gpuquota_share_capacity_gpus", share="language-main", gpu_type="a10g") == 2
    assert value(scraped, "gpuquota_share_lent_gpus", share="language-main", gpu_type="a10g") == 1.0
    assert value(scraped, "gpuquota_share_lent_gpus", share="(unassigned)", gpu_type="a10g") == 1.0
    assert (
        value(
            scraped, "gpuquota_lending_gpus", gpu_type="a10g", lender="language-main", borrower="vision-main"
        )
        == 1.0
    )


def test_it_counts_queued_and_running_jobs(scraped):
    assert value(scraped, "gpuquota_running_jobs", share="vision-main", gpu_type="a10g") == 2
    assert value(scraped, "gpuquota_queued_jobs", share="vision-main", gpu_type="a10g") == 1
    assert value(scraped, "gpuquota_running_jobs", share="language-main", gpu_type="a10g") == 0
    assert value(scraped, "gpuquota_queued_jobs", share="language-main", gpu_type="a10g") == 1
    assert ("gpuquota_queued_jobs", (("gpu_type", "a10g"), ("share", "(unassigned)"))) not in scraped


def test_it_counts_admissions_and_preemptions(scraped):
    assert value(scraped, "gpuquota_admissions_total", share="vision-main", mode="own") == 1
    assert value(scraped, "gpuquota_admissions_total", share="vision-main", mode="borrowed") == 2
    assert value(scraped, "gpuquota_admissions_total", share="language-main", mode="own") == 0
    assert value(scraped, "gpuquota_preemptions_total", share="vision-main", reason="RECLAIM") == 1
    assert value(scraped, "gpuquota_preemptions_total", share="vision-main", reason="PRIORITY") == 0
    assert value(scraped, "gpuquota_preemptions_total", share="language-main", reason="RECLAIM") == 0


def test_it_histograms_first_attempt_waits(scraped):
    # vision's first attempts waited 10 s, 100 s and 600 s.
    assert value(scraped, "gpuquota_wait_seconds_count", share="vision-main") == 3
    assert value(scraped, "gpuquota_wait_seconds_sum", share="vision-main") == pytest.approx(710)
    assert value(scraped, "gpuquota_wait_seconds_bucket", share="vision-main", le="5.0") == 0
    assert value(scraped, "gpuquota_wait_seconds_bucket", share="vision-main", le="15.0") == 1
    assert value(scraped, "gpuquota_wait_seconds_bucket", share="vision-main", le="120.0") == 2
    assert value(scraped, "gpuquota_wait_seconds_bucket", share="vision-main", le="900.0") == 3
    assert value(scraped, "gpuquota_wait_seconds_bucket", share="vision-main", le="+Inf") == 3
    assert value(scraped, "gpuquota_wait_seconds_count", share="language-main") == 0


def test_it_histograms_pass_durations(scraped):
    assert value(scraped, "gpuquota_pass_duration_seconds_count") == 3
    assert value(scraped, "gpuquota_pass_duration_seconds_sum") == pytest.approx(0.743)
    assert value(scraped, "gpuquota_pass_duration_seconds_bucket", le="0.005") == 1
    assert value(scraped, "gpuquota_pass_duration_seconds_bucket", le="0.05") == 2
    assert value(scraped, "gpuquota_pass_duration_seconds_bucket", le="0.5") == 2
    assert value(scraped, "gpuquota_pass_duration_seconds_bucket", le="1.0") == 3
    assert value(scraped, "gpuquota_last_pass_timestamp_seconds") > 0


def test_it_reports_nodes(cluster):
    Node.objects.filter(name="node-2").update(state="CORDONED")
    data = samples(render().decode())
    assert value(data, "gpuquota_node_up", node="node-1", gpu_type="a10g") == 1
    assert value(data, "gpuquota_node_schedulable", node="node-2", gpu_type="a10g") == 0
    assert value(data, "gpuquota_node_gpus", node="node-1", gpu_type="a10g", state="used") == 4
    assert value(data, "gpuquota_node_gpus", node="node-1", gpu_type="a10g", state="free") == 0
    assert value(data, "gpuquota_node_gpus", node="node-2", gpu_type="a10g", state="used") == 2
    assert value(data, "gpuquota_node_gpus", node="node-2", gpu_type="a10g", state="unavailable") == 2
    assert value(data, "gpuquota_node_gpus", node="node-2", gpu_type="a10g", state="free") == 0


def test_a_silent_node_is_down(cluster):
    Node.objects.filter(name="node-1").update(last_heartbeat=None)
    data = samples(render().decode())
    assert value(data, "gpuquota_node_up", node="node-1", gpu_type="a10g") == 0
    assert value(data, "gpuquota_node_up", node="node-2", gpu_type="a10g") == 1


def test_an_outage_of_the_control_sides_hearing_is_an_alert(cluster):
    from datetime import timedelta

    from django.utils import timezone

    from quotas import scheduler

    Node.objects.update(last_heartbeat=timezone.now())
    scheduler.run_pass("test")  # hears both nodes, from now: no node could be declared LOST yet
    data = samples(render().decode())
    assert value(data, "gpuquota_heartbeat_silence_seconds") < 5
    assert value(data, "gpuquota_node_loss_suspended") == 1
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=300))  # nobody heard since
    data = samples(render().decode())
    assert value(data, "gpuquota_heartbeat_silence_seconds") == pytest.approx(300, abs=5)
    assert value(data, "gpuquota_node_loss_suspended") == 1


# -- cost ------------------------------------------------------------------------------------------


def test_a_scrape_costs_the_same_queries_with_more_jobs(
    cluster, bob, vision_share, django_assert_num_queries
):
    render()  # warm caches (content types etc.), so both counts below are like for like
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        render()
    for _ in range(30):
        submit(bob, vision_share, 1)
    with django_assert_num_queries(len(few.captured_queries)):
        render()
    # 12, GPU failures by reason (issue 29), lost work by cause (26), the organisation tree's groups and
    # fair-sharing settings (37)
    assert len(few.captured_queries) <= 16
