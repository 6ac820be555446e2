"""Shares: everyone logged in reads every share with its live usage; admins create, change, delete."""

import pytest

from quotas.choices import ShareState, Strategy
from quotas.models import Share, Team
from tests.api.conftest import run, submit
from tests.conftest import make_share

URL = "/api/v1/shares/"


def share_in(response, name):
    return next(s for s in response.json()["results"] if s["name"] == name)


def test_a_member_reads_every_share_with_capacity_and_usage(as_bob, vision_share, language_share, nodes):
    r = as_bob.get(URL)
    assert r.status_code == 200
    assert [s["name"] for s in r.json()["results"]] == ["language-main", "vision-main"]
    vision = share_in(r, "vision-main")
    assert vision["capacity"] == {"a10g": 4}
    assert vision["team"] == "vision"
    assert vision["strategy"] == Strategy.LEND_AND_BORROW
    assert vision["usage"]["a10g"] == {
        "own": 0,
        "borrowed": 0,
        "lent": 0.0,
        "queued_gpus": 0,
        "running_jobs": 0,
        "queued_jobs": 0,
    }


def test_usage_counts_running_and_queued_work_of_other_teams_too(as_charlie, bob, vision_share, nodes):
    running = submit(bob, vision_share, gpus=4)
    run(running, nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    submit(bob, vision_share, gpus=3)
    usage = as_charlie.get(f"{URL}vision-main/").json()["usage"]["a10g"]
    assert usage["own"] == 4
    assert usage["borrowed"] == 2
    assert usage["running_jobs"] == 2
    assert usage["queued_jobs"] == 1
    assert usage["queued_gpus"] == 3


def test_a_lender_shows_what_it_lends(as_bob, bob, vision_share, language_share, nodes):
    # vision borrows 2 beyond its 4; language (LEND, 2 idle) and the unassigned pool (2) can lend.
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    lent = as_bob.get(f"{URL}language-main/").json()["usage"]["a10g"]["lent"]
    assert lent == pytest.approx(1.0)


def test_anonymous_gets_401(anon, vision_share):
    assert anon.get(URL).status_code == 401
    assert anon.get(f"{URL}vision-main/").status_code == 401


def test_an_unknown_share_is_a_404(as_bob, bob):
    assert as_bob.get(f"{URL}nope/").status_code == 404


def test_shares_filter_by_team(as_bob, vision_share, language_share):
    r = as_bob.get(URL, {"team": "language"})
    assert [s["name"] for s in r.json()["results"]] == ["language-main"]


def test_an_admin_creates_a_share(as_alice, vision, nodes):
    r = as_alice.post(
        URL,
        {"name": "vision-burst", "team": "vision", "capacity": {"a10g": 2}, "strategy": "RESERVE"},
        format="json",
    )
    assert r.status_code == 201, r.json()
    assert r.json()["capacity"] == {"a10g": 2}
    assert r.json()["usage"]["a10g"]["own"] == 0
    assert Share.objects.get(name="vision-burst").strategy == Strategy.RESERVE


def test_an_admin_changes_capacity_and_state(
    as_alice, vision_share, no_messages, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        r = as_alice.patch(
            f"{URL}vision-main/", {"capacity": {"a10g": 6, "h100": 1}, "state": "DISABLED"}, format="json"
        )
    assert r.status_code == 200, r.json()
    assert r.json()["capacity"] == {"a10g": 6, "h100": 1}
    assert r.json()["state"] == ShareState.DISABLED
    assert ("pass", "layout version 1") in no_messages  # a plan applied at once: version 1


def test_an_admin_deletes_a_disabled_share_without_jobs(as_alice, vision_share):
    Share.objects.filter(pk=vision_share.pk).update(state=ShareState.DISABLED)
    assert as_alice.delete(f"{URL}vision-main/").status_code == 204
    assert not Share.objects.exists()


def test_an_enabled_share_is_not_deleted_as_on_the_dashboard(as_alice, vision_share):
    r = as_alice.delete(f"{URL}vision-main/")
    assert r.status_code == 409
    assert r.json()["detail"] == 'Disable share "vision-main" before deleting it.'
    assert Share.objects.filter(pk=vision_share.pk).exists()


def test_a_share_with_jobs_cannot_be_deleted(as_alice, bob, vision_share, nodes):
    submit(bob, vision_share)
    Share.objects.filter(pk=vision_share.pk).update(state=ShareState.DISABLED)
    r = as_alice.delete(f"{URL}vision-main/")
    assert r.status_code == 409
    detail = r.json()["detail"]
    assert 'share "vision-main" cannot be removed' in detail and "1 job(s) queued or running" in detail


def test_members_cannot_write_shares(as_bob, vision_share):
    assert as_bob.post(URL, {"name": "x", "team": "vision"}, format="json").status_code == 403
    assert as_bob.patch(f"{URL}vision-main/", {"capacity": {"a10g": 8}}, format="json").status_code == 403
    assert as_bob.delete(f"{URL}vision-main/").status_code == 403
    assert Share.objects.get(name="vision-main").capacity_map() == {"a10g": 4}


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"name": "Bad Name", "team": "vision"},
            "name",
            "Use 1 to 63 lower-case letters, digits or hyphens.",
        ),
        ({"name": "ok", "team": "nope"}, "team", 'No team with slug "nope".'),
        (
            {"name": "ok", "team": "vision", "capacity": {"a10g": -1}},
            "capacity",
            "Ensure this value is greater than or equal to 0.",
        ),
        (
            {"name": "ok", "team": "vision", "capacity": {"A10G!": 1}},
            "capacity",
            '"A10G!" is not a GPU type: use a lower-case name such as a10g or h100.',
        ),
        (
            {"name": "ok", "team": "vision", "capacity": [1]},
            "capacity",
            'Expected a dictionary of items but got type "list".',
        ),
        ({"name": "ok", "team": "vision", "strategy": "HOARD"}, "strategy", '"HOARD" is not a valid choice.'),
        (
            {"name": "ok", "team": "vision", "strategy": "RESERVE", "borrow_limit": 50},
            "borrow_limit",
            "Only a LEND_AND_BORROW share borrows: leave borrow_limit at -1 for RESERVE.",
        ),
        (
            {"name": "ok", "team": "vision", "borrow_limit": -2},
            "borrow_limit",
            "Ensure this value is greater than or equal to -1.",
        ),
        ({"name": "vision-main", "team": "vision"}, "name", 'A share named "vision-main" already exists.'),
        ({"name": "ok", "team": "vision", "colour": "red"}, "colour", "Unknown field."),
    ],
)
def test_bad_share_input_is_a_400_with_the_fields_message(as_alice, vision_share, body, field, message):
    r = as_alice.post(URL, body, format="json")
    assert r.status_code == 400, r.json()
    assert any(m.startswith(message) for m in _messages(r.json()[field])), r.json()


def _messages(value):
    if isinstance(value, dict):  # DictField errors are per key
        return [m for v in value.values() for m in _messages(v)]
    return [m for v in value for m in _messages(v)] if isinstance(value, list) else [value]


def test_the_share_list_runs_a_constant_number_of_queries(as_bob, bob, nodes, django_assert_max_num_queries):
    team = Team.objects.get(slug="vision")
    for i in range(8):
        share = make_share(team, f"s-{i}", capacity={"a10g": 1, "h100": 1})
        run(submit(bob, share, gpus=1), nodes[i // 4], [i % 4])
        submit(bob, share, gpus=1)
    as_bob.get(URL)
    # 13: one is the largest queued job per share and type, for each share's fair_share (issue 37)
    with django_assert_max_num_queries(13):
        r = as_bob.get(URL)
    assert len(r.json()["results"]) == 8
