"""Every dashboard page and action × role against what it must answer (issue 8, "Permission matrix").

Pages answer in categories: "ok" (2xx, or a redirect that is not to the login page; 400/409 are
"ok" too: allowed, but the input or the state said no), "login" (a redirect to log in), "denied" (403
or 404: another team's things do not exist for you). Roles as in the API matrix, plus "staff" (Django
staff flag, not a superuser, in no team): a staff flag alone grants nothing in gpuquota (the API's
admin is the superuser), and "deactivated" (logged in, then made inactive: the session is dead).
"""

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

ROLES = ("admin", "manager", "member", "other", "staff", "anonymous", "deactivated")


def expect(admin, manager, member, other, staff, anonymous="login", deactivated="login"):
    return dict(zip(ROLES, (admin, manager, member, other, staff, anonymous, deactivated), strict=True))


EVERYONE = expect("ok", "ok", "ok", "ok", "ok")
ADMINS = expect("ok", "denied", "denied", "denied", "denied")
VISION = expect("ok", "ok", "ok", "denied", "denied")

SUBMIT = {"share": "vision-main", "gpu_type": "a10g", "gpus": "1", "priority": "0", "command": "true"}

# (url name, method, path template, form data, {role: category})
PAGES = [
    ("overview", "get", "/", None, EVERYONE),
    ("team_list", "get", "/teams/", None, EVERYONE),
    ("team", "get", "/teams/vision/", None, VISION),
    ("job_submit", "post", "/teams/vision/submit/", SUBMIT, VISION),
    ("job", "get", "/jobs/{job}/", None, VISION),
    ("job", "get", "/jobs/{other_job}/", None, expect("ok", "denied", "denied", "ok", "denied")),
    ("job_cancel", "post", "/jobs/{job}/cancel/", {}, VISION),
    ("job_cancel", "post", "/jobs/{peer_job}/cancel/", {}, expect("ok", "ok", "denied", "denied", "denied")),
    ("job_priority", "post", "/jobs/{job}/priority/", {"priority": "5"}, VISION),
    (
        "job_priority",
        "post",
        "/jobs/{peer_job}/priority/",
        {"priority": "5"},
        expect("ok", "ok", "denied", "denied", "denied"),
    ),
    # Only an admin releases a HELD job (a job that is not held answers 409: allowed, state said no).
    ("job_release", "post", "/jobs/{job}/release/", {}, ADMINS),
    ("array_cancel", "post", "/arrays/{array}/cancel/", {}, VISION),
    ("array_priority", "post", "/arrays/{array}/priority/", {"priority": "5"}, VISION),
    ("nodes", "get", "/nodes/", None, EVERYONE),
    ("node_action", "post", "/nodes/{node}/cordon/", {}, ADMINS),
    ("node_action", "post", "/nodes/{node}/drain/", {}, ADMINS),
    ("node", "get", "/nodes/{node}/", None, EVERYONE),
    ("gpu_mark_healthy", "post", "/nodes/{node}/gpus/0/mark-healthy/", {}, ADMINS),
    ("share_list", "get", "/shares/", None, ADMINS),
    ("share_create", "get", "/shares/new/", None, ADMINS),
    ("share_create", "post", "/shares/new/", {"name": "x"}, ADMINS),
    ("share_whatif_new", "post", "/shares/new/whatif/", {"name": "x"}, ADMINS),
    ("share_edit", "get", "/shares/vision-main/", None, ADMINS),
    ("share_edit", "post", "/shares/vision-main/", {"name": "vision-main"}, ADMINS),
    ("share_whatif", "post", "/shares/vision-main/whatif/", {"name": "vision-main"}, ADMINS),
    (
        "share_sweep",
        "post",
        "/shares/vision-main/sweep/",
        {"setting": "borrow_limit", "values": "0, 100"},
        ADMINS,
    ),
    ("whatif_run", "get", "/whatif/{whatif_run}/", None, ADMINS),
    ("share_state", "post", "/shares/{spare}/state/", {"state": "DISABLED"}, ADMINS),
    ("share_delete", "post", "/shares/old/delete/", {}, ADMINS),
    ("audit", "get", "/audit/", None, ADMINS),
    ("share_layout", "get", "/layout/", None, ADMINS),
    ("share_layout_versions", "get", "/layout/versions/", None, ADMINS),  # to /layout/'s versions
    ("share_layout_plan", "post", "/layout/plan/", {"document": "teams: []", "whatif": "0"}, ADMINS),
    ("share_layout_plan", "post", "/layout/plan/", {"rollback": "1", "whatif": "0"}, ADMINS),
    ("share_layout_plan_show", "get", "/layout/plans/{plan}/", None, ADMINS),
    ("share_layout_apply", "post", "/layout/plans/{plan}/apply/", {}, ADMINS),
    ("usage", "get", "/usage/", None, ADMINS),
    ("organisation", "get", "/organisation/", None, EVERYONE),
    ("advice", "get", "/advice/", None, ADMINS),
    ("advice", "post", "/advice/", {"weeks": "9"}, ADMINS),  # a 400 for an admin: no run started here
    ("advice_run", "get", "/advice/{advice_run}/", None, ADMINS),
    ("advice_cancel", "post", "/advice/{advice_run}/cancel/", {}, ADMINS),
    ("advice_plan", "post", "/advice/{advice_run}/plan/", {"point": "0"}, ADMINS),  # 400: no answer yet
    ("admin", "get", "/admin/", None, expect("ok", "login", "login", "login", "ok")),
    ("healthz", "get", "/healthz", None, expect("ok", "ok", "ok", "ok", "ok", "ok", "ok")),
    ("metrics", "get", "/metrics", None, expect(*(["denied"] * 5), "denied", "denied")),
    ("login", "get", "/login/", None, expect("ok", "ok", "ok", "ok", "ok", "ok", "ok")),
    ("logout", "post", "/logout/", {}, expect(*(["login"] * 5), "login", "login")),  # back to log in
    # Sign-in with the directory: not configured here, so not there for anyone (issue 40).
    ("oidc_authentication_init", "get", "/oidc/authenticate/", None, expect(*(["denied"] * 7))),
    ("oidc_authentication_callback", "get", "/oidc/callback/", None, expect(*(["denied"] * 7))),
    ("account-tokens", "get", "/account/tokens/", None, EVERYONE),
    ("account-tokens", "post", "/account/tokens/", {}, EVERYONE),
    ("notifications", "get", "/account/notifications/", None, EVERYONE),
    ("notifications", "post", "/account/notifications/", {"form": "email", "events": ["ended"]}, EVERYONE),
    # a channel of team vision: its managers' (and admins') to remove
    (
        "notification-channel-delete",
        "post",
        "/account/notifications/{channel}/delete/",
        {},
        expect("ok", "ok", "denied", "denied", "denied"),
    ),
]


def category(response) -> str:
    code = response.status_code
    if code in (301, 302, 303) and "login" in response.get("Location", ""):
        return "login"
    if code in (403, 404):
        return "denied"
    if code < 400 or code in (400, 409):
        return "ok"
    return str(code)


def _case(name, method, path, data, role, want):
    return pytest.param(name, method, path, data, role, want, id=f"{method}-{path}-{role}")


CASES = [_case(n, m, p, d, role, want[role]) for n, m, p, d, want in PAGES for role in ROLES]


@pytest.fixture
def pages(request, world, django_user_model, vision):
    from notify.models import Channel
    from quotas import advice, layout, whatif
    from tests.conftest import make_share

    make_share(vision, "old", capacity={"a10g": 1}, state="DISABLED")
    # A what-if, an advice run and a plan only for the rows whose path names one (most of the set-up).
    path = request.node.callspec.params["path"]
    if "{whatif_run}" in path:
        world["whatif_run"] = whatif.start_preview(share="vision-main", changes={})  # its tasks are not run
    if "{advice_run}" in path:
        world["advice_run"] = advice.start(weeks=1)  # nor these
    if "{plan}" in path:
        world["plan"] = layout.plan(source=layout.load_live().layout.to_data(), run_whatif=False).pk
    world["channel"] = Channel.objects.create(team=vision, kind="chat", url="https://hooks.example.org/x").pk
    staff = django_user_model.objects.create_user("sam", "sam@example.com", "sam-pw-123", is_staff=True)
    world["users"]["staff"] = staff
    return world


def page_client(world, role, client):
    if role == "anonymous":
        return client
    user = world["users"]["revoked" if role == "deactivated" else role]
    client.force_login(user)
    if role == "deactivated":
        user.is_active = False
        user.save()
    return client


@pytest.mark.parametrize("name,method,path,data,role,want", CASES)
def test_page_matrix(pages, client, name, method, path, data, role, want):
    c = page_client(pages, role, client)
    url = path.format(**pages)
    response = getattr(c, method)(url, data) if method == "post" else c.get(url)
    assert category(response) == want, (method, url, role, response.status_code, response.get("Location"))


def _named_routes(patterns, prefix=""):
    for p in patterns:
        if isinstance(p, URLResolver):
            if str(p.pattern) in ("admin/", "api/"):
                continue
            yield from _named_routes(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern) and p.name:
            yield p.name


def test_every_page_is_in_the_matrix():
    """A new page must get its rows here."""
    missing = set(_named_routes(get_resolver().url_patterns)) - {name for name, *_ in PAGES}
    assert not missing, sorted(missing)
