"""Teams: admins write; members read their own team with its members; other teams stay hidden."""

from quotas.models import Membership, Team
from tests.conftest import make_share

URL = "/api/v1/teams/"


def test_a_member_reads_their_own_team_with_its_members(as_bob, vision_share, charlie):
    r = as_bob.get(URL)
    assert r.status_code == 200
    (team,) = r.json()["results"]
    assert team["slug"] == "vision"
    assert team["members"] == [{"username": "bob", "role": "member"}]
    assert team["shares"] == ["vision-main"]


def test_a_member_does_not_see_another_team(as_bob, charlie):
    assert as_bob.get(f"{URL}language/").status_code == 404


def test_an_admin_reads_every_team(as_alice, bob, charlie):
    r = as_alice.get(URL)
    assert [t["slug"] for t in r.json()["results"]] == ["language", "vision"]


def test_anonymous_gets_401(anon, bob):
    assert anon.get(URL).status_code == 401


def test_an_admin_creates_a_team_with_members(as_alice, bob, charlie):
    r = as_alice.post(
        URL,
        {
            "name": "Speech",
            "slug": "speech",
            "members": [{"username": "bob", "role": "manager"}, {"username": "charlie"}],
        },
        format="json",
    )
    assert r.status_code == 201, r.json()
    assert r.json()["members"] == [
        {"username": "bob", "role": "manager"},
        {"username": "charlie", "role": "member"},
    ]


def test_an_admin_changes_a_teams_members(as_alice, bob, charlie):
    r = as_alice.patch(
        f"{URL}vision/", {"members": [{"username": "charlie", "role": "manager"}]}, format="json"
    )
    assert r.status_code == 200, r.json()
    assert list(Membership.objects.filter(team__slug="vision").values_list("user__username", "role")) == [
        ("charlie", "manager")
    ]


def test_a_member_cannot_create_or_change_teams(as_bob, bob):
    assert as_bob.post(URL, {"name": "X", "slug": "x"}, format="json").status_code == 403
    assert as_bob.patch(f"{URL}vision/", {"name": "Y"}, format="json").status_code == 403
    assert Team.objects.get(slug="vision").name == "Vision"


def test_an_unknown_member_is_a_400_naming_them(as_alice, bob):
    r = as_alice.patch(f"{URL}vision/", {"members": [{"username": "zed"}]}, format="json")
    assert r.status_code == 400
    assert r.json()["members"] == ['No user named "zed".']


def test_a_duplicate_slug_is_a_400(as_alice, bob, charlie):
    r = as_alice.post(URL, {"name": "Other", "slug": "vision"}, format="json")
    assert r.status_code == 400
    assert "slug" in r.json()


def test_a_team_with_shares_cannot_be_deleted(as_alice, vision_share):
    r = as_alice.delete(f"{URL}vision/")
    assert r.status_code == 409
    assert "still owns shares" in r.json()["detail"]


def test_an_admin_deletes_an_empty_team(as_alice, db):
    Team.objects.create(name="Empty", slug="empty")
    assert as_alice.delete(f"{URL}empty/").status_code == 204


def test_the_team_list_runs_a_constant_number_of_queries(as_alice, bob, django_assert_max_num_queries):
    for i in range(5):
        team = Team.objects.create(name=f"T{i}", slug=f"t{i}")
        Membership.objects.create(team=team, user=bob)
        make_share(team, f"s-{i}", capacity={"a10g": 1})
    as_alice.get(URL)  # warm the token and auth paths
    with django_assert_max_num_queries(6):
        r = as_alice.get(URL)
    assert len(r.json()["results"]) == 6
