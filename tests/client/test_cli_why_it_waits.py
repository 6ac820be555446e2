"""Why a share waits to borrow, in the CLI (issue 37, item 3): `gpuquota status JOB` and `gpuquota groups`
print the server's words, the organisation page's (quotas.organisation.why_it_waits)."""

import pytest

from tests import why_world


@pytest.fixture
def world(alice, bob, charlie, vision_share, language_share, nodes):
    return why_world.build(alice, bob, charlie, vision_share, language_share, nodes)


def test_status_says_why_a_queued_job_waits_to_borrow(logged_in, world):
    code, out, err = logged_in("status", world["vision_waits"].pk)
    assert code == 0, err
    assert f"why it waits: {why_world.LIMIT_WORDS}; {why_world.BEHIND_WORDS}" in out
    code, out, err = logged_in("status", world["speech_waits"].pk)
    assert f"why it waits: {why_world.LIMIT_WORDS}\n" in out


def test_status_of_a_running_job_has_no_such_line(logged_in, world):
    running = world["vision_waits"].share.jobs.get(name="own-run")
    code, out, err = logged_in("status", running.pk)
    assert code == 0, err
    assert "why it waits" not in out


def test_groups_lists_each_share_that_waits_and_why(logged_in, world):
    code, out, err = logged_in("groups")
    assert code == 0, err
    assert f"vision-main waits to borrow a10g: {why_world.LIMIT_WORDS}; {why_world.BEHIND_WORDS}" in out
    assert f"speech waits to borrow a10g: {why_world.LIMIT_WORDS}" in out
    assert "language-main waits" not in out
    code, out, _ = logged_in("groups", "--gpu-type", "h100")
    assert "waits to borrow" not in out
