"""A share's protection window (min_runtime_s, SEMANTICS rule 10) through the API: read, set, refused in
the limit's one sentence (jobs.limits.MIN_RUNTIME), audited."""

import pytest

from quotas.models import AuditEntry, Share

URL = "/api/v1/shares/"
LIMIT = (
    "min_runtime_s is 0 to 86,400 seconds (MAX_MIN_RUNTIME_S): how long a share's jobs run before a "
    "pre-emption may take them."
)


def test_a_share_reads_with_its_protection_window(as_bob, vision_share):
    assert as_bob.get(f"{URL}vision-main/").json()["min_runtime_s"] == 0


def test_an_admin_sets_it_and_the_change_is_audited(as_alice, vision_share):
    r = as_alice.patch(f"{URL}vision-main/", {"min_runtime_s": 600}, format="json")
    assert r.status_code == 200 and r.json()["min_runtime_s"] == 600
    assert Share.objects.get(name="vision-main").min_runtime_s == 600
    # A share's change is a layout version (quotas.layout): one entry with what changed.
    entry = AuditEntry.objects.filter(object_type="layout").latest("at")
    assert [(c["field"], c["before"], c["after"]) for c in entry.changes] == [("min_runtime_s", 0, 600)]


def test_a_share_is_created_with_one(as_alice, vision):
    body = {"name": "vision-x", "team": "vision", "capacity": {"a10g": 1}, "min_runtime_s": 120}
    r = as_alice.post(URL, body, format="json")
    assert r.status_code == 201 and r.json()["min_runtime_s"] == 120


@pytest.mark.parametrize("value", [-1, 86_401, 2**40])
def test_a_window_out_of_its_limit_is_a_400_in_the_limits_words(as_alice, vision_share, value):
    r = as_alice.patch(f"{URL}vision-main/", {"min_runtime_s": value}, format="json")
    assert r.status_code == 400 and r.json() == {"min_runtime_s": [LIMIT]}
    assert Share.objects.get(name="vision-main").min_runtime_s == 0


@pytest.mark.parametrize("value", ["ten minutes", 1.5, None, [600]])
def test_a_window_that_is_not_a_whole_number_is_a_400(as_alice, vision_share, value):
    r = as_alice.patch(f"{URL}vision-main/", {"min_runtime_s": value}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["min_runtime_s"]
    assert Share.objects.get(name="vision-main").min_runtime_s == 0


def test_the_limit_follows_the_setting(as_alice, vision_share, settings):
    settings.MAX_MIN_RUNTIME_S = 300
    r = as_alice.patch(f"{URL}vision-main/", {"min_runtime_s": 301}, format="json")
    assert r.status_code == 400 and "0 to 300 seconds" in r.json()["min_runtime_s"][0]


def test_a_member_may_not_set_it(as_bob, vision_share):
    assert as_bob.patch(f"{URL}vision-main/", {"min_runtime_s": 60}, format="json").status_code == 403
    assert Share.objects.get(name="vision-main").min_runtime_s == 0
