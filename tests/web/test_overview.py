"""The overview: share cards with capacity bars, cluster totals, lending Sankey, history, pre-emption
feed; live partials for htmx; the same numbers without JavaScript; constant queries."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import EventKind
from jobs.services import record_event
from quotas import usage
from tests.api.conftest import run
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


def test_it_asks_anonymous_users_to_log_in(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_login_page_logs_in(client, bob, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    bob.set_password("bob-pw-123")
    bob.save()
    assert b'for="id_username"' in client.get("/login/").content
    response = client.post("/login/", {"username": "bob", "password": "bob-pw-123"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_it_shows_a_card_per_share_with_bars_and_badges(as_bob, vision_share, language_share, nodes, bob):
    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    body = as_bob.get("/").content.decode()
    assert 'data-share="vision-main"' in body and 'data-share="language-main"' in body
    assert "LEND_AND_BORROW" in body and "borrow unlimited" in body
    assert "own used <b>2</b>" in body  # text beside every colour
    assert 'data-testid="used-a10g">2<' in body
    assert 'hx-trigger="every 3s"' in body


def test_sankey_shows_who_lends_to_whom(as_bob, vision_share, language_share, nodes, bob):
    # vision (capacity 4) runs 6: 2 borrowed from language's idle 2.
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    body = hx(as_bob, "/?part=sankey").content.decode()
    assert 'data-plot="sankey"' in body
    assert "<td>language-main</td><td>vision-main</td>" in body


def test_no_sankey_while_nobody_borrows(as_bob, vision_share, nodes):
    assert 'data-testid="no-lending"' in hx(as_bob, "/?part=sankey").content.decode()


def test_partials_render_alone_for_htmx(as_bob, vision_share, nodes):
    for part, marker in [
        ("cards", 'id="cards"'),
        ("totals", 'id="totals"'),
        ("feed", 'id="feed"'),
        ("history", 'id="history"'),
        ("sankey", 'id="sankey"'),
    ]:
        body = hx(as_bob, f"/?part={part}").content.decode()
        assert body.lstrip().startswith("<section") and marker in body and "<html" not in body


def test_without_htmx_a_part_parameter_gets_the_whole_page(as_bob, vision_share):
    assert b"<html" in as_bob.get("/?part=cards").content


def test_feed_lists_reclaims_and_hides_other_teams_job_names(
    as_charlie, vision_share, language_share, nodes, bob, charlie
):
    job = submit(bob, vision_share, name="secret-vision-job")
    record_event(job.pk, EventKind.PREEMPTING, "PREEMPTED_RECLAIM by job 9 of share language-main")
    body = as_charlie.get("/").content.decode()
    assert "PREEMPTED_RECLAIM by job 9 of share language-main" in body
    assert "secret-vision-job" not in body
    assert f'href="/jobs/{job.pk}/"' not in body


def test_history_chart_reads_usage_samples(as_bob, vision_share, nodes, bob):
    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    usage.sample(timezone.now() - timedelta(minutes=2))
    usage.sample()
    body = hx(as_bob, "/?part=history").content.decode()
    assert 'data-plot="history"' in body and '"vision-main": [2.0, 2.0]' in body


def test_overcommit_warns(as_alice, vision_share, nodes):
    vision_share.capacities.update(max_gpus=20)
    assert "Over-committed" in as_alice.get("/").content.decode()


def test_overview_runs_constant_queries(as_bob, bob, vision_share, language_share, nodes, constant_queries):
    for _ in range(3):
        submit(bob, vision_share)
    run(submit(bob, vision_share), nodes[0], [0])

    def grow():
        for i in range(40):
            job = submit(bob, vision_share)
            record_event(job.pk, EventKind.PREEMPTING, f"PREEMPTED_PRIORITY by job {i}")
        run(submit(bob, vision_share), nodes[1], [0, 1])
        usage.sample()

    usage.sample()
    constant_queries(as_bob, "/", grow)


def test_a_silence_of_every_node_shows_a_banner_not_lost_nodes(as_bob, vision_share, nodes):
    from gpunodes.models import Node
    from quotas import scheduler
    from quotas.models import SchedulerPass

    Node.objects.update(last_heartbeat=timezone.now())
    scheduler.run_pass("test")
    body = as_bob.get("/").content.decode()
    assert 'data-testid="hearing-outage"' not in body
    assert 'data-testid="hearing-resumed"' not in body  # a first start: there was no silence
    # The control worker away 2 minutes while the agents (never restarted) ran on, then back.
    SchedulerPass.objects.update(started_at=timezone.now() - timedelta(seconds=125))
    scheduler.run_pass("test")
    body = as_bob.get("/").content.decode()
    banner = body.split('data-testid="hearing-resumed">', 1)[1].split("</p>", 1)[0]
    assert banner.startswith("Heartbeats heard again 0 s ago, after 2 min in which no node was heard")
    assert "no node is declared lost for 3 min more" in banner and "NODE_LOST_AFTER_S" not in banner
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=90))
    body = as_bob.get("/").content.decode()
    assert 'data-testid="hearing-outage"' in body and "No heartbeat from any node for 90 s" in body
    assert 'data-testid="hearing-outage"' in hx(as_bob, "/?part=live").content.decode()


def _feed_badges(client) -> list[str]:
    return re.findall(r'<span class="badge [^"]*">([^<]*)</span>', hx(client, "/?part=feed").content.decode())


@pytest.mark.parametrize(
    "how, detail",
    [
        # What a Ctrl-C'd agent reports from its outbox once it is back (gpunodes.agent.runner.shutdown).
        ("shutdown", "stopped at the orderly shutdown of the agent on node-1"),
        ("unknown", "stopped at the shutdown of the agent on node-1"),  # an agent from before "shutdown"
    ],
)
def test_feed_says_agent_stopped_for_jobs_a_clean_shutdown_stopped(
    as_bob, bob, vision_share, nodes, how, detail
):
    from jobs.tasks import attempt_finished

    attempt = run(submit(bob, vision_share), nodes[0], [0])
    assert attempt_finished(attempt.pk, 1, "node-1", how=how, exit_code=-9, detail=detail)
    assert _feed_badges(as_bob) == ["agent stopped"]
    body = hx(as_bob, "/?part=feed").content.decode()
    assert detail in body and "no longer runs it" not in body and 'class="badge off"' not in body


def test_feed_says_agent_restarted_for_jobs_a_restarted_agent_no_longer_runs(
    as_bob, bob, vision_share, nodes
):
    from gpunodes.services import fake_inventory, node_heartbeat

    run(submit(bob, vision_share), nodes[0], [0])
    inventory = fake_inventory("node-1", 4)
    node_heartbeat(name="node-1", gpu_type="a10g", inventory=inventory, running=[(1, 1)], boot_id="boot-1")
    node_heartbeat(name="node-1", gpu_type="a10g", inventory=inventory, running=[], boot_id="boot-2")
    assert _feed_badges(as_bob) == ["agent restarted"]


def test_feed_says_node_lost_for_a_node_that_stopped_heartbeating(as_bob, bob, vision_share, nodes):
    from gpunodes.models import Node
    from quotas import scheduler
    from tests.conftest import heard_all_along

    run(submit(bob, vision_share), nodes[0], [0])
    Node.objects.update(last_heartbeat=timezone.now())
    Node.objects.filter(name="node-1").update(last_heartbeat=timezone.now() - timedelta(hours=1))
    heard_all_along()
    assert scheduler.run_pass("test").lost_nodes == ["node-1"]
    assert _feed_badges(as_bob) == ["node lost"]
    assert 'class="badge off">node lost' in hx(as_bob, "/?part=feed").content.decode()
