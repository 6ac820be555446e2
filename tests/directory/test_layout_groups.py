"""Teams from the directory in the layout document (issue 40.2): `members_from` / `managers_from`
exported, planned (a group no sign-in has named is a warning, not an error; a bad value a 400 under its
path), applied (who signed in before gets the teams at once, each an audit entry) and rolled back like
any layout change; the memberships the directory made stay out of the document's `members`."""

import pytest
import yaml

from directory.models import DirectoryGroup, DirectoryMembership, Identity, TeamDirectory
from quotas.choices import Role
from quotas.models import AuditEntry, Membership
from tests.api.conftest import client_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/layout/"


@pytest.fixture
def as_alice(alice):
    return client_for(alice)


@pytest.fixture
def dana(django_user_model):
    """Someone who signed in through the directory before, in vision-researchers."""
    user = django_user_model.objects.create_user("dana")
    Identity.objects.create(
        user=user, issuer="https://id.example.org", subject="d-1", groups=["oidc:vision-researchers"]
    )
    DirectoryGroup.objects.create(name="oidc:vision-researchers", last_seen="2026-01-01T00:00Z")
    return user


def export(client) -> dict:
    r = client.get(URL, {"format": "json"})
    assert r.status_code == 200, r.content
    return r.json()


def plan(client, document):
    return client.post(f"{URL}plan/", {"document": document, "whatif": False}, format="json")


def plan_and_apply(client, document) -> dict:
    r = plan(client, document)
    assert r.status_code == 201, r.content
    applied = client.post(f"{URL}plans/{r.json()['id']}/apply/", None, format="json")
    assert applied.status_code == 200, applied.content
    return r.json()


def with_groups(data: dict, slug: str, **groups) -> dict:
    team = next(t for t in data["teams"] if t["slug"] == slug)
    team.update(groups)
    return data


def test_a_layout_without_groups_exports_as_before(as_alice, vision):
    team = next(t for t in export(as_alice)["teams"] if t["slug"] == "vision")
    assert set(team) == {"slug", "name", "members"}


def test_it_is_planned_applied_exported_and_rolled_back(as_alice, vision, dana):
    data = with_groups(export(as_alice), "vision", members_from=["oidc:vision-researchers"])
    planned = plan_and_apply(as_alice, data)
    assert any(
        c["kind"] == "team"
        and {"field": "members_from", "before": None, "after": "oidc:vision-researchers"} in c["fields"]
        for c in planned["changes"]
    ), planned["changes"]
    assert TeamDirectory.objects.get(team=vision).members_from == ["oidc:vision-researchers"]
    # dana signed in before: a member at once, made by the directory, and audited as its change
    assert Membership.objects.get(team=vision, user=dana).role == Role.MEMBER
    assert DirectoryMembership.objects.filter(team=vision, user=dana).exists()
    assert AuditEntry.objects.filter(
        action="directory", object_type="team", object_id=str(vision.pk)
    ).exists()

    exported = export(as_alice)
    team = next(t for t in exported["teams"] if t["slug"] == "vision")
    assert team["members_from"] == ["oidc:vision-researchers"]
    assert "dana" not in [m["user"] for m in team["members"]]  # the directory's, not the document's
    text = as_alice.get(URL, {"format": "yaml"}).content.decode()
    assert yaml.safe_load(text)["teams"][-1]["members_from"] == ["oidc:vision-researchers"]
    again = plan(as_alice, exported)
    assert again.status_code == 201 and again.json()["changed"] is False  # export, plan: no change

    version = as_alice.get(f"{URL}versions/").json()["results"][0]["number"]
    back = as_alice.post(f"{URL}plan/", {"rollback": version - 1, "whatif": False}, format="json")
    assert back.status_code == 201, back.content
    assert as_alice.post(f"{URL}plans/{back.json()['id']}/apply/", None, format="json").status_code == 200
    assert not TeamDirectory.objects.exists()
    assert not Membership.objects.filter(team=vision, user=dana).exists()


def test_managers_from_makes_managers(as_alice, vision, dana):
    Identity.objects.filter(user=dana).update(groups=["oidc:vision-leads", "oidc:vision-researchers"])
    data = with_groups(
        export(as_alice),
        "vision",
        members_from=["oidc:vision-researchers"],
        managers_from=["oidc:vision-leads"],
    )
    plan_and_apply(as_alice, data)
    assert Membership.objects.get(team=vision, user=dana).role == Role.MANAGER


def test_a_group_no_sign_in_has_named_is_a_warning(as_alice, vision, dana):
    data = with_groups(
        export(as_alice), "vision", members_from=["oidc:vision-researchers", "oidc:vision-reserchers"]
    )
    r = plan(as_alice, data)
    assert r.status_code == 201, r.content
    warnings = r.json()["warnings"]
    assert any('"oidc:vision-reserchers"' in w for w in warnings), warnings
    assert not any('"oidc:vision-researchers"' in w for w in warnings)


@pytest.mark.parametrize(
    "groups, path, message",
    [
        ({"members_from": "oidc:x"}, "members_from", "must be a list"),
        ({"members_from": ["vision-researchers"]}, "members_from[0]", 'must start with "oidc:"'),
        ({"managers_from": ["oidc:a", 7]}, "managers_from[1]", "must be a directory group"),
        ({"managers_from": ["oidc:a", "oidc:a"]}, "managers_from[1]", "listed twice"),
        ({"members_from": ["oidc:"]}, "members_from[0]", "1 to 255 characters"),
        ({"members_from": ["oidc:a\u200bb"]}, "members_from[0]", "printable"),
    ],
)
def test_a_bad_value_is_a_400_under_its_path(as_alice, vision, groups, path, message):
    data = export(as_alice)
    index = [t["slug"] for t in data["teams"]].index("vision")
    r = plan(as_alice, with_groups(data, "vision", **groups))
    assert r.status_code == 400, r.content
    errors = r.json()
    key = f"teams[{index}].{path}"
    assert key in errors and any(message in m for m in errors[key]), errors
