"""Wording a person reads: "just now", not "0 minutes"."""

import pytest

from tests.api.conftest import run
from tests.web.conftest import hx, submit


@pytest.mark.django_db
def test_a_job_that_just_started_says_just_now_not_0_minutes(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert "0 minutes" not in body and "just now" in body
    run(job, nodes[0], [0])
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert "0 minutes" not in body and "just now" in body
    assert "0 minutes" not in as_bob.get(f"/jobs/{job.pk}/").content.decode()


def test_job_path_gives_the_url_that_reverse_gives(settings):
    """The team queue formats per-job URLs from one reversed pattern (job_path): they must be the
    URLs Django would reverse, for every per-job route the queue links to."""
    from django.urls import reverse

    from quotas.templatetags.gpuquota import job_path

    for name in ("job", "job_priority", "job_cancel"):
        for pk in (1, 42, 987654321, 10**12):
            assert job_path(name, pk) == reverse(name, args=[pk])
