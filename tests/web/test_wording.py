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
