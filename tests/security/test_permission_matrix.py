"""Every API endpoint × every role against the status it must answer (issue 8, "Permission matrix").

Roles: admin, a manager of team vision, a member of vision (bob, who owns `job`), a member of another
team (charlie), anonymous, and a revoked token. `peer_job` is a vision job bob did not submit; the
other team's jobs are invisible (404) to vision, not merely forbidden, so ids do not leak what exists.
"""

import pytest

from tests.security.conftest import ROLES, client_as

V1 = "/api/v1"


def expect(admin, manager, member, other, anonymous=401, revoked=401):
    return dict(zip(ROLES, (admin, manager, member, other, anonymous, revoked), strict=True))


READ_ALL = expect(200, 200, 200, 200)
ADMIN_ONLY_READ = expect(200, 403, 403, 403)
ADMIN_ONLY_WRITE = {"create": expect(201, 403, 403, 403), "ok": expect(200, 403, 403, 403)}

# (name, method, url template, JSON body, {role: status})
MATRIX = [
    # auth
    ("token-current-delete", "delete", "/auth/token/current/", None, expect(204, 204, 204, 204)),
    ("tokens-list", "get", "/auth/tokens/", None, READ_ALL),
    # a user's own token: its owner and admins may revoke it; others do not see it (404)
    ("tokens-delete-bob", "delete", "/auth/tokens/bob/", None, expect(204, 404, 204, 404)),
    # teams
    ("teams-list", "get", "/teams/", None, READ_ALL),
    ("teams-retrieve", "get", "/teams/vision/", None, expect(200, 200, 200, 404)),
    ("teams-create", "post", "/teams/", {"name": "New", "slug": "new"}, ADMIN_ONLY_WRITE["create"]),
    ("teams-update", "patch", "/teams/vision/", {"name": "Vision 2"}, ADMIN_ONLY_WRITE["ok"]),
    ("teams-delete", "delete", "/teams/{empty_team}/", None, expect(204, 403, 403, 403)),
    # shares
    ("shares-list", "get", "/shares/", None, READ_ALL),
    ("shares-retrieve", "get", "/shares/vision-main/", None, READ_ALL),
    (
        "shares-create",
        "post",
        "/shares/",
        {"name": "new-share", "team": "vision", "capacity": {"a10g": 1}},
        ADMIN_ONLY_WRITE["create"],
    ),
    ("shares-update", "patch", "/shares/vision-main/", {"description": "x"}, ADMIN_ONLY_WRITE["ok"]),
    ("shares-delete", "delete", "/shares/{spare}/", None, expect(204, 403, 403, 403)),
    ("shares-track-record", "get", "/shares/vision-main/track-record/", None, READ_ALL),
    # the organisation tree: everyone logged in reads it; it changes only through the layout
    ("groups-list", "get", "/groups/", None, READ_ALL),
    ("groups-create", "post", "/groups/", {"name": "x"}, expect(405, 403, 403, 403)),
    # nodes
    ("nodes-list", "get", "/nodes/", None, READ_ALL),
    ("nodes-retrieve", "get", "/nodes/{node}/", None, READ_ALL),
    ("nodes-cordon", "post", "/nodes/{node}/cordon/", None, ADMIN_ONLY_WRITE["ok"]),
    ("nodes-uncordon", "post", "/nodes/{node}/uncordon/", None, ADMIN_ONLY_WRITE["ok"]),
    ("nodes-drain", "post", "/nodes/{node}/drain/", None, ADMIN_ONLY_WRITE["ok"]),
    ("nodes-mark-healthy", "post", "/nodes/{node}/gpus/0/mark-healthy/", None, ADMIN_ONLY_WRITE["ok"]),
    # jobs
    ("jobs-list", "get", "/jobs/", None, READ_ALL),
    (
        "jobs-create",
        "post",
        "/jobs/",
        {"share": "vision-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"]},
        expect(201, 201, 201, 403),
    ),
    ("jobs-retrieve", "get", "/jobs/{job}/", None, expect(200, 200, 200, 404)),
    ("jobs-retrieve-peer", "get", "/jobs/{peer_job}/", None, expect(200, 200, 200, 404)),
    ("jobs-retrieve-other-team", "get", "/jobs/{other_job}/", None, expect(200, 404, 404, 200)),
    ("jobs-priority", "patch", "/jobs/{job}/", {"priority": 5}, expect(200, 200, 200, 404)),
    ("jobs-priority-peer", "patch", "/jobs/{peer_job}/", {"priority": 5}, expect(200, 200, 403, 404)),
    ("jobs-cancel", "post", "/jobs/{job}/cancel/", None, expect(200, 200, 200, 404)),
    ("jobs-cancel-peer", "post", "/jobs/{peer_job}/cancel/", None, expect(200, 200, 403, 404)),
    ("jobs-grace", "patch", "/jobs/{job}/", {"preemption_grace_s": 60}, expect(200, 200, 200, 404)),
    ("jobs-grace-peer", "patch", "/jobs/{peer_job}/", {"preemption_grace_s": 60}, expect(200, 200, 403, 404)),
    # releasing a held job is an admin's (Slurm's admin hold); this one is not held: 409 for the admin
    ("jobs-release", "post", "/jobs/{job}/release/", None, expect(409, 403, 403, 404)),
    ("jobs-logs", "get", "/jobs/{job}/logs/", None, expect(200, 200, 200, 404)),
    ("jobs-logs-other-team", "get", "/jobs/{other_job}/logs/", None, expect(200, 404, 404, 200)),
    # jobs cannot be deleted or replaced through the API, by anyone
    ("jobs-delete", "delete", "/jobs/{job}/", None, expect(405, 405, 405, 405)),
    ("jobs-put", "put", "/jobs/{job}/", {"priority": 1}, expect(405, 405, 405, 405)),
    # arrays (bob's): like his jobs
    ("arrays-list", "get", "/arrays/", None, READ_ALL),
    ("arrays-retrieve", "get", "/arrays/{array}/", None, expect(200, 200, 200, 404)),
    ("arrays-priority", "patch", "/arrays/{array}/", {"priority": 5}, expect(200, 200, 200, 404)),
    ("arrays-cancel", "post", "/arrays/{array}/cancel/", None, expect(200, 200, 200, 404)),
    # queue
    ("queue", "get", "/queue/", None, READ_ALL),
    # usage, lost work and what sharing cost: admins only
    ("usage", "get", "/usage/", None, ADMIN_ONLY_READ),
    # the advisor: admins only (a bad body is a 400 for an admin, a 403 for anyone else)
    ("advice-start", "post", "/advice/", {"weeks": 9}, expect(400, 403, 403, 403)),
    ("advice-retrieve", "get", "/advice/no-such-run/", None, expect(404, 403, 403, 403)),
    ("advice-cancel", "post", "/advice/no-such-run/cancel/", None, expect(404, 403, 403, 403)),
    ("advice-plan", "post", "/advice/no-such-run/plan/", {"point": 0}, expect(404, 403, 403, 403)),
    # audit log: admins only, read-only
    ("audit-list", "get", "/audit/", None, ADMIN_ONLY_READ),
    ("audit-retrieve", "get", "/audit/{audit}/", None, ADMIN_ONLY_READ),
    ("audit-delete", "delete", "/audit/{audit}/", None, expect(405, 403, 403, 403)),
    ("audit-create", "post", "/audit/", {"action": "x"}, expect(405, 403, 403, 403)),
    # the layout: admins read it whole; a team manager reads its own team's part; only admins plan,
    # apply, and read plans, versions and temporary changes
    ("layout-read", "get", "/layout/", None, expect(200, 200, 403, 403)),
    ("layout-read-yaml", "get", "/layout/?format=yaml", None, expect(200, 200, 403, 403)),
    (
        "layout-plan",
        "post",
        "/layout/plan/",
        {"document": "{plan_document}", "whatif": False},
        ADMIN_ONLY_WRITE["create"],
    ),
    (
        "layout-plan-rollback",
        "post",
        "/layout/plan/",
        {"rollback": 1, "whatif": False},
        ADMIN_ONLY_WRITE["create"],
    ),
    ("layout-plan-retrieve", "get", "/layout/plans/{plan}/", None, ADMIN_ONLY_READ),
    ("layout-plan-apply", "post", "/layout/plans/{plan}/apply/", None, ADMIN_ONLY_WRITE["ok"]),
    ("layout-plan-delete", "delete", "/layout/plans/{plan}/", None, expect(405, 403, 403, 403)),
    ("layout-versions-list", "get", "/layout/versions/", None, ADMIN_ONLY_READ),
    ("layout-versions-retrieve", "get", "/layout/versions/1/", None, ADMIN_ONLY_READ),
    ("layout-temporary-list", "get", "/layout/temporary/", None, ADMIN_ONLY_READ),
    ("layout-temporary-retrieve", "get", "/layout/temporary/{temporary}/", None, ADMIN_ONLY_READ),
]

CASES = [
    pytest.param(name, method, url, body, role, statuses[role], id=f"{name}-{role}")
    for name, method, url, body, statuses in MATRIX
    for role in ROLES
]


@pytest.fixture
def layout_world(world):
    """The world with a layout version (1: spare's description, ending in a day), a plan of the layout
    as it is, and a document to plan (the live one, spare's description changed)."""
    from quotas import layout, services
    from quotas.models import Share

    services.share_update(
        share=Share.objects.get(name="spare"), description="spare GPUs", actor=world["users"]["admin"]
    )
    data = layout.load_live().layout.to_data()
    entry = next(s for s in data["shares"] if s["name"] == "vision-main")
    entry["description"], entry["until"] = "for a day", "1d"
    temporary = layout.apply(plan_id=layout.plan(source=data, run_whatif=False).pk).version
    document = layout.load_live().layout.to_data()
    document["shares"][0]["description"] = "planned"
    return {
        **world,
        "plan": layout.plan(source=layout.load_live().layout.to_data(), run_whatif=False).pk,
        "plan_document": document,
        "temporary": temporary.temporary_changes.get().pk,
    }


def _body(body, values):
    if isinstance(body, dict):
        return {k: _body(v, values) for k, v in body.items()}
    if isinstance(body, str) and body.startswith("{") and body.endswith("}") and body[1:-1] in values:
        return values[body[1:-1]]
    return body


@pytest.mark.parametrize("name,method,url,body,role,status", CASES)
def test_permission_matrix(request, name, method, url, body, role, status):
    # Only the layout's rows need a version, a plan and a temporary change (most of a case's set-up).
    world = request.getfixturevalue("layout_world" if name.startswith("layout") else "world")
    client = client_as(world, role)
    path = V1 + url.format(**world)
    body = _body(body, world)
    response = getattr(client, method)(path, body, format="json") if body else getattr(client, method)(path)
    assert response.status_code == status, (method, path, role, response.content[:300])


def test_a_team_manager_reads_only_its_own_teams_part_of_the_layout(layout_world):
    data = client_as(layout_world, "manager").get(f"{V1}/layout/").json()
    assert data["team_part"] == ["vision"]
    assert [t["slug"] for t in data["teams"]] == ["vision"]
    assert {s["name"] for s in data["shares"]} == {"vision-main", "spare"}  # not language-main
    text = client_as(layout_world, "manager").get(f"{V1}/layout/?format=yaml").content.decode()
    assert "team_part: [vision]" in text and "language" not in text
    whole = client_as(layout_world, "admin").get(f"{V1}/layout/").json()
    assert "team_part" not in whole and {t["slug"] for t in whole["teams"]} == {"vision", "language", "empty"}


def test_every_api_route_is_in_the_matrix():
    """A new endpoint must get its row here: compare the routes of /api/v1/ against the matrix."""
    from config.api_urls import router

    covered = {url.split("{")[0].split("/")[1] for _, _, url, _, _ in MATRIX}
    routes = {prefix.split("/")[0] for prefix, _, _ in router.registry}
    assert routes <= covered | {"auth"}, sorted(routes - covered)


PUBLIC = [
    ("post", "/api/v1/auth/token/", {"username": "bob", "password": "bob-pw-123"}, 200),
    ("post", "/api/v1/auth/token/", {"username": "bob", "password": "wrong"}, 400),
    ("get", "/api/schema/", None, 200),
    ("get", "/api/docs/", None, 200),
    ("get", "/healthz", None, 200),
    ("get", "/api/v1/no-such-thing/", None, 404),
]


@pytest.mark.parametrize("method,path,body,status", PUBLIC)
def test_public_endpoints(world, method, path, body, status):
    client = client_as(world, "anonymous")
    response = getattr(client, method)(path, body, format="json") if body else getattr(client, method)(path)
    assert response.status_code == status


def test_an_inactive_users_token_is_refused(world):
    from tests.api.conftest import client_for

    bob = world["users"]["member"]
    client = client_for(bob)
    bob.is_active = False
    bob.save()
    assert client.get(f"{V1}/jobs/").status_code == 401


def test_a_staff_flag_alone_is_not_admin_in_the_api(world, django_user_model):
    from tests.api.conftest import client_for

    sam = django_user_model.objects.create_user("sam", password="sam-pw-123", is_staff=True)
    client = client_for(sam)
    assert client.get(f"{V1}/audit/").status_code == 403
    assert client.patch(f"{V1}/shares/vision-main/", {"description": "x"}, format="json").status_code == 403
    assert client.post(f"{V1}/nodes/{world['node']}/cordon/").status_code == 403
    assert client.get(f"{V1}/jobs/{world['job']}/").status_code == 404


def test_a_browser_session_cannot_write_through_the_api_without_the_csrf_token(world):
    """Session auth works beside tokens for the browser: a cross-site form post carries the session
    cookie but not the CSRF token, and must be refused."""
    from rest_framework.test import APIClient

    client = APIClient(enforce_csrf_checks=True)
    client.force_login(world["users"]["member"])
    r = client.post(
        f"{V1}/jobs/",
        {"share": "vision-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"]},
        format="json",
    )
    assert r.status_code == 403 and "CSRF" in r.json()["detail"]
    assert client.post(f"{V1}/jobs/{world['job']}/cancel/").status_code == 403
    assert client.get(f"{V1}/jobs/").status_code == 200  # reads need no token
