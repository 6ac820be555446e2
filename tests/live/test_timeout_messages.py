"""A live test that gives up says what it saw of its jobs: state and reason, attempts, last events (a
CI excerpt said only "timed out after 30s waiting for a3 making progress")."""

import pytest

from jobs import lifecycle
from jobs.choices import Outcome
from tests.api.conftest import run, submit
from tests.live.conftest import wait_for


@pytest.mark.django_db
def test_a_timeout_names_each_jobs_state_reason_attempts_and_last_events(bob, vision_share, nodes):
    waiting = submit(bob, vision_share, name="a1")
    failed = submit(bob, vision_share, name="a3")
    attempt = run(failed, nodes[0], [0])
    reason = "could not start '/root/x/train.py': permission denied"
    lifecycle.end_attempt(attempt.pk, attempt.number, outcome=Outcome.FAILED, exit_code=None, reason=reason)
    with pytest.raises(AssertionError) as raised:
        wait_for(lambda: False, 0.2, every=0.05, what="a3 making progress", jobs=[waiting, failed.pk])
    text = str(raised.value)
    assert text.startswith("timed out after 0.2s waiting for a3 making progress\n")
    assert f"job {waiting.pk} a1: QUEUED; attempts: none; last events: " in text and "SUBMITTED" in text
    assert f"job {failed.pk} a3: FAILED ({reason})" in text
    assert f"attempts: #1 ENDED FAILED ({reason})" in text
