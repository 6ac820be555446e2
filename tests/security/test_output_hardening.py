"""What the product shows and stores holds (issue 18): names without control characters or bidi
overrides, env values for the job's owner and admins only, plain error answers as text/plain, a
Content-Security-Policy without inline script or eval, bounded per-attempt logs, rotated host logs."""

import os
import re
import time
from pathlib import Path

import pytest
from django.conf import settings

from gpunodes.agent.runner import LOG
from jobs.api.redaction import REDACTED
from tests.gpunodes.test_runner import wait_finished
from tests.security.conftest import client_as
from tests.security.test_agent_hardening import make_runner, start

UNPRINTABLE = ["evil\x1b]0;pwned\x07", "abc\u202egpj.exe", "a\u2066b", "zero\u200bwidth", "line\u2028break"]


@pytest.mark.parametrize("name", UNPRINTABLE)
def test_a_job_name_with_control_or_bidi_characters_is_refused(world, name):
    r = client_as(world, "member").post(
        "/api/v1/jobs/",
        {"share": "vision-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"], "name": name},
        format="json",
    )
    assert r.status_code == 400 and "name" in r.json()


def test_a_plain_unicode_name_is_fine(world):
    r = client_as(world, "member").post(
        "/api/v1/jobs/",
        {
            "share": "vision-main",
            "gpu_type": "a10g",
            "gpus": 1,
            "command": ["true"],
            "name": "résumé-训练 🚀",
        },
        format="json",
    )
    assert r.status_code == 201, r.json()


@pytest.mark.parametrize("name", UNPRINTABLE[:2])
def test_the_submit_form_refuses_them_too(name):
    from jobs.forms import SubmitForm

    form = SubmitForm(data={"name": name})
    form.is_valid()
    assert "name" in form.errors


@pytest.mark.parametrize("name", UNPRINTABLE[:2])
def test_team_names_and_share_descriptions_refuse_them(world, name):
    admin = client_as(world, "admin")
    r = admin.post("/api/v1/teams/", {"name": name, "slug": "t-x"}, format="json")
    assert r.status_code == 400 and "name" in r.json()
    r = admin.patch(f"/api/v1/shares/{world['spare']}/", {"description": name}, format="json")
    assert r.status_code == 400 and "description" in r.json()


# --- env values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "role, sees", [("member", True), ("admin", True), ("manager", False)]
)  # bob (member) owns the job; dave is his team's manager
def test_env_values_show_only_to_the_jobs_owner_and_admins(world, role, sees):
    r = client_as(world, role).get(f"/api/v1/jobs/{world['job']}/")
    assert r.status_code == 200
    assert r.json()["env"] == ({"SECRET_TOKEN": "vision-secret"} if sees else {"SECRET_TOKEN": REDACTED})
    listed = client_as(world, role).get("/api/v1/jobs/").content.decode()
    assert ("vision-secret" in listed) == sees


# --- plain answers and CSP ---------------------------------------------------------------------------


def test_a_refused_node_action_answers_text_plain(world, client):
    client.force_login(world["users"]["admin"])
    r = client.post(f"/nodes/{world['node']}/<img src=x onerror=alert(1)>/")
    assert r.status_code == 400 and r["Content-Type"].startswith("text/plain")


def test_every_page_carries_a_csp_without_inline_script_or_eval(world, client):
    client.force_login(world["users"]["admin"])
    for path in ("/", "/nodes/", "/login/", "/api/docs/", "/admin/"):
        csp = client.get(path, follow=True)["Content-Security-Policy"]
        script = re.search(r"script-src ([^;]*)", csp).group(1)
        assert script.strip() == "'self'", (path, csp)
        assert "frame-ancestors 'none'" in csp


def test_no_template_has_inline_script_or_event_handlers():
    offenders = []
    for path in Path(settings.BASE_DIR, "templates").rglob("*.html"):
        text = path.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            if "src=" not in tag and "application/json" not in tag:
                offenders.append(f"{path.name}: {tag}")
        offenders += [f"{path.name}: {m}" for m in re.findall(r"\s(on[a-z]+|hx-on[:\w-]*)=", text)]
    assert not offenders, offenders


def test_htmx_runs_without_eval():
    base = Path(settings.BASE_DIR, "templates", "base.html").read_text()
    assert '"allowEval":false' in base


# --- logs on the host and in the database ---------------------------------------------------------


def test_an_attempts_log_is_capped_keeping_head_and_tail(tmp_path, reports):
    runner = make_runner(tmp_path, reports, log_cap_bytes=2000)
    try:
        code = "import sys; sys.stdout.write('HEAD' + 'x' * 50000 + 'TAIL'); sys.stdout.flush()"
        import sys

        start(runner, [sys.executable, "-c", code])
        wait_finished(runner, reports)
    finally:
        runner.shutdown(grace_s=0)
    text = "".join(k["text"] for k in reports.of(LOG))
    assert text.startswith("HEAD") and text.endswith("TAIL")
    assert len(text) < 2000 + 200 and "bytes of output dropped" in text


def test_old_job_log_files_on_the_host_are_removed(tmp_path, reports):
    runner = make_runner(tmp_path, reports)
    old = runner.log_dir / "job-3" / "attempt-1.n1.log"
    new = runner.log_dir / "job-4" / "attempt-1.n1.log"
    for f in (old, new):
        f.parent.mkdir(parents=True)
        f.write_text("x")
    past = time.time() - 8 * 86400
    os.utime(old, (past, past))
    assert runner.prune_logs(7 * 86400) == 1
    assert not old.parent.exists() and new.exists()
