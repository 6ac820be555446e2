"""Security test fixtures: the API tests' no-messages setup, plus the six roles of the permission
matrix: admin (alice), team manager (dave, vision), team member (bob, vision), other team (charlie,
language), anonymous, and a revoked token (rita's, deleted after she got it)."""

import pytest
from knox.models import AuthToken
from rest_framework.test import APIClient

from jobs.services import job_array_submit
from quotas.choices import Role, ShareState
from quotas.models import Membership, Team
from tests.api.conftest import as_alice, as_bob, client_for, submit, taken  # noqa: F401 - fixtures too
from tests.conftest import make_share
from tests.security.agent_helpers import reports, root_dir, root_runner  # noqa: F401 - host-side fixtures

ROLES = ("admin", "manager", "member", "other", "anonymous", "revoked")


@pytest.fixture
def dave(django_user_model, vision):
    user = django_user_model.objects.create_user("dave", "dave@example.com", "dave-pw-123")
    Membership.objects.create(team=vision, user=user, role=Role.MANAGER)
    return user


@pytest.fixture
def rita(django_user_model, vision):
    user = django_user_model.objects.create_user("rita", "rita@example.com", "rita-pw-123")
    Membership.objects.create(team=vision, user=user, role=Role.MEMBER)
    return user


def revoked_client(user) -> APIClient:
    _, key = AuthToken.objects.create(user=user)
    AuthToken.objects.filter(
        user=user
    ).delete()  # what DELETE /auth/token/current/ does: logged out everywhere
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def world(alice, bob, charlie, dave, rita, vision, language, vision_share, language_share, nodes):
    """Everything the matrix acts on: a job of bob's, a job of his manager's, one of the other team's,
    an empty team and an empty share (deletable), one audit entry."""
    from quotas import audit

    AuthToken.objects.create(user=bob)  # bob has logged in: his token exists to be revoked
    empty_team = Team.objects.create(name="Empty", slug="empty")
    # Disabled: a share is deleted only once disabled (quotas.services.share_delete).
    spare = make_share(vision, "spare", capacity={"a10g": 1}, state=ShareState.DISABLED)
    entry = audit.record_audit(alice, "create", spare, {}, audit.snapshot(spare))
    return {
        "users": {"admin": alice, "manager": dave, "member": bob, "other": charlie, "revoked": rita},
        "job": submit(
            bob,
            vision_share,
            name="vision-job-name",
            command=["python", "train.py", "--vision-cmd-secret"],
            env={"SECRET_TOKEN": "vision-secret"},
        ).pk,
        "peer_job": submit(dave, vision_share).pk,
        "other_job": submit(charlie, language_share, env={"LANG_SECRET": "language-secret"}).pk,
        "array": job_array_submit(
            user=bob, share=vision_share, size=2, gpus=1, gpu_type="a10g", command=["true"]
        ).pk,
        "empty_team": empty_team.slug,
        "spare": spare.name,
        "audit": entry.pk,
        "node": nodes[0].name,
    }


def client_as(world, role: str) -> APIClient:
    if role == "anonymous":
        return APIClient()
    if role == "revoked":
        return revoked_client(world["users"]["revoked"])
    return client_for(world["users"][role])


@pytest.fixture(autouse=True)
def _quiet(no_messages):
    return no_messages


@pytest.fixture(autouse=True)
def _refusals_unlogged(monkeypatch):
    """Each test starts with no refusal logged yet (gpunodes.signing logs each cause once a minute)."""
    from gpunodes import signing

    monkeypatch.setattr(signing, "_logged", {})
