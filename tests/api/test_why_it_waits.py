"""Why a share waits to borrow, through the API (issue 37, item 3): a share's `fair_share` per type and a
queued job's `why_it_waits` say what the organisation page says (quotas.organisation.why_it_waits):
the group limit that binds and the shares with a lower fair-share value that go first; nothing for a
job that does not wait to borrow. Groups and shares by name, never another team's jobs."""

import pytest

from quotas import organisation
from tests import why_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(alice, bob, charlie, vision_share, language_share, nodes):
    return why_world.build(alice, bob, charlie, vision_share, language_share, nodes)


def test_a_share_says_why_it_waits_in_the_pages_words(as_bob, world):
    vision = as_bob.get("/api/v1/shares/vision-main/").json()["fair_share"]["a10g"]
    assert vision["why_it_waits"] == [why_world.LIMIT_WORDS, why_world.BEHIND_WORDS]
    speech = as_bob.get("/api/v1/shares/speech/").json()["fair_share"]["a10g"]
    assert speech["why_it_waits"] == [why_world.LIMIT_WORDS]  # nobody with a lower value goes first
    language = as_bob.get("/api/v1/shares/language-main/").json()["fair_share"]["a10g"]
    assert language["why_it_waits"] == []  # a lender does not wait to borrow
    # The same list the organisation page and the share page show (one function).
    lines = organisation.share_lines(organisation.load(), ["vision-main"])
    assert [line["why"] for line in lines] == [vision["why_it_waits"]]


def test_a_share_list_says_it_too(as_charlie, world):
    body = as_charlie.get("/api/v1/shares/").json()
    rows = body["results"] if isinstance(body, dict) else body
    by_name = {s["name"]: s["fair_share"]["a10g"]["why_it_waits"] for s in rows}
    assert by_name["vision-main"] == [why_world.LIMIT_WORDS, why_world.BEHIND_WORDS]


def test_a_queued_job_says_why_its_share_waits(as_bob, world):
    job = as_bob.get(f"/api/v1/jobs/{world['vision_waits'].pk}/").json()
    assert job["why_it_waits"] == [why_world.LIMIT_WORDS, why_world.BEHIND_WORDS]
    job = as_bob.get(f"/api/v1/jobs/{world['speech_waits'].pk}/").json()
    assert job["why_it_waits"] == [why_world.LIMIT_WORDS]


def test_a_job_that_does_not_wait_to_borrow_says_nothing(as_bob, as_charlie, world):
    running = world["vision_waits"].share.jobs.get(name="own-run")
    assert as_bob.get(f"/api/v1/jobs/{running.pk}/").json()["why_it_waits"] == []
    small = as_charlie.get(f"/api/v1/jobs/{world['small'].pk}/").json()
    assert small["state"] == "QUEUED" and small["why_it_waits"] == []


def test_the_words_name_no_job_of_another_team(as_charlie, world):
    # charlie (team language) reads vision-main's reasons: groups and shares, no job name, no user.
    words = " ".join(
        as_charlie.get("/api/v1/shares/vision-main/").json()["fair_share"]["a10g"]["why_it_waits"]
    )
    for secret in ("vision-waits", "own-run", "borrowed-run", "speech-own", "bob"):
        assert secret not in words


def test_a_polled_job_reuses_the_organisation_until_a_pass_runs(as_bob, world, settings):
    """`gpuquota status` in a loop and the page's refresh poll a queued job: its "why it waits" reads the
    whole organisation once per ORGANISATION_RECENT_S and pass, then one small query per poll."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from quotas.models import SchedulerPass

    settings.ORGANISATION_RECENT_S = 60
    url = f"/api/v1/jobs/{world['vision_waits'].pk}/"
    with CaptureQueriesContext(connection) as first:
        assert as_bob.get(url).json()["why_it_waits"] == [why_world.LIMIT_WORDS, why_world.BEHIND_WORDS]
    with CaptureQueriesContext(connection) as again:
        assert as_bob.get(url).json()["why_it_waits"] == [why_world.LIMIT_WORDS, why_world.BEHIND_WORDS]
    assert len(again) <= len(first) - 5, (len(first), len(again))

    # The group's limit lifted: the words say so only once a pass has run since.
    from quotas.models import Group

    Group.objects.filter(name="research").update(borrow_limit=-1)
    assert as_bob.get(url).json()["why_it_waits"] == [why_world.LIMIT_WORDS, why_world.BEHIND_WORDS]
    SchedulerPass.objects.create(started_at=world["vision_waits"].submitted_at)
    with CaptureQueriesContext(connection) as after_pass:
        words = as_bob.get(url).json()["why_it_waits"]
    assert len(after_pass) >= len(first) - 1
    assert why_world.LIMIT_WORDS not in words, words
