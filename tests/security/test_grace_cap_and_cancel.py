"""Issue 30, finding 5: a member could keep a lender's GPUs for ever. The API and the CLI took a grace of
2,147,483,647 s (the form stopped at 86,400), and a cancel printed CANCELLED while the process ran on,
holding the GPUs. Now: one cap, MAX_PREEMPTION_GRACE_S, in the same words in the form, the API (both
submit paths and PATCH) and the CLI (before any request); a stop is never sent with more; and a cancelled
running job is CANCELLING, its GPUs held, until its host reports the processes gone, then CANCELLED."""

import io
import json
import re
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.dispatch import PREEMPT
from jobs import lifecycle
from jobs.choices import AttemptState, EventKind, JobState
from jobs.models import Attempt, GpuClaim, Job
from jobs.tasks import attempt_finished
from quotas.scheduler import expire_stops, load_snapshot, run_pass
from tests.api.conftest import client_for, run, submit
from tests.client.conftest import CLIENT_SRC

URL = "/api/v1/jobs/"
CAP_WORDS = (
    "The grace period is 0 to 3,600 seconds (MAX_PREEMPTION_GRACE_S): the time a pre-empted or cancelled "
    "job has between SIGTERM and SIGKILL."
)


def body(**overrides):
    return {"share": "vision-main", "gpus": 1, "gpu_type": "a10g", "command": ["true"], **overrides}


# --- the cap, in every interface ------------------------------------------------------------------


@pytest.mark.parametrize("grace", [3601, 86_401, 2_147_483_647, 10**20, -1])
def test_the_api_refuses_a_grace_past_the_cap_in_the_caps_words(as_bob, vision_share, nodes, grace, taken):
    r = as_bob.post(URL, body(preemption_grace_s=grace), format="json")
    assert r.status_code == 400, r.json()
    assert r.json()["preemption_grace_s"] == [CAP_WORDS]
    assert not taken and not Job.objects.exists()  # the quick way passed it on; nothing written


def test_the_cap_itself_is_accepted_by_both_submit_paths(as_bob, vision_share, nodes, settings, taken):
    assert as_bob.post(URL, body(preemption_grace_s=3600), format="json").status_code == 201
    assert len(taken) == 1  # the quick way
    settings.FAST_SUBMIT = False
    assert as_bob.post(URL, body(preemption_grace_s=3600), format="json").status_code == 201
    assert list(Job.objects.values_list("preemption_grace_s", flat=True)) == [3600, 3600]


def test_the_cap_is_the_setting(as_bob, vision_share, nodes, settings):
    settings.MAX_PREEMPTION_GRACE_S = 600
    r = as_bob.post(URL, body(preemption_grace_s=601), format="json")
    assert r.status_code == 400
    assert r.json()["preemption_grace_s"][0].startswith("The grace period is 0 to 600 seconds")
    assert as_bob.post(URL, body(preemption_grace_s=600), format="json").status_code == 201


def test_an_array_is_held_to_the_same_cap(as_bob, vision_share, nodes):
    r = as_bob.post(URL, body(preemption_grace_s=99_999, array={"size": 3}), format="json")
    assert r.status_code == 400 and r.json()["preemption_grace_s"] == [CAP_WORDS]
    assert not Job.objects.exists()


def test_patch_is_held_to_the_same_cap(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    r = as_bob.patch(f"{URL}{job.pk}/", {"preemption_grace_s": 2_147_483_647}, format="json")
    assert r.status_code == 400 and r.json()["preemption_grace_s"] == [CAP_WORDS]
    r = as_bob.patch(f"{URL}{job.pk}/", {"preemption_grace_s": 120}, format="json")
    assert r.status_code == 200 and r.json()["preemption_grace_s"] == 120
    assert r.json()["events"][-1]["kind"] == EventKind.GRACE_CHANGED
    assert r.json()["events"][-1]["reason"] == "grace 30 s → 120 s by bob"


def test_the_form_refuses_it_beside_the_field_in_the_same_words(client, bob, vision_share, nodes):
    client.force_login(bob)
    response = client.post(
        "/teams/vision/submit/",
        {
            "share": "vision-main",
            "gpu_type": "a10g",
            "gpus": 1,
            "priority": 0,
            "command": "python train.py",
            "preemption_grace_s": "86400",  # the form's old maximum
        },
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="id_preemption_grace_s-error"' in html and CAP_WORDS in html
    field = re.search(r'<input[^>]*name="preemption_grace_s"[^>]*>', html).group(0)
    assert 'min="0" max="3600"' in field  # the browser knows the cap too
    assert not Job.objects.exists()


@pytest.fixture
def cli(capsys, monkeypatch, config_file):
    if str(CLIENT_SRC) not in sys.path:
        sys.path.insert(0, str(CLIENT_SRC))
    from gpuquota_client.cli import main

    def call(*argv, stdin=""):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "gpuquota" / "config.json"
    monkeypatch.setenv("GPUQUOTA_CONFIG", str(path))
    monkeypatch.delenv("GPUQUOTA_URL", raising=False)
    monkeypatch.delenv("GPUQUOTA_TOKEN", raising=False)
    return path


def submit_args(*extra):
    return ["submit", "--share", "vision-main", "--gpus", "1", "--gpu-type", "a10g", *extra, "--", "true"]


@pytest.mark.parametrize("grace", ["2h", "1d", "596523h"])
def test_the_cli_refuses_it_with_exit_2_before_any_request(cli, config_file, grace):
    # A server nobody listens on: a request would exit 1 ("cannot reach").
    config_file.parent.mkdir(parents=True)
    config_file.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "x" * 40}))
    code, out, err = cli(*submit_args("--grace", grace))
    assert code == 2 and not out
    assert err == f"gpuquota: --grace: {CAP_WORDS}\n"


def test_the_cli_holds_to_the_limits_the_server_told_at_login(
    cli, live_server, bob, vision_share, nodes, settings
):
    settings.MAX_PREEMPTION_GRACE_S = 7200
    code, _, err = cli("login", live_server.url, "-u", "bob", "--password-stdin", stdin="bob-pw-123\n")
    assert code == 0, err
    code, out, err = cli(*submit_args("--grace", "90m"))  # past the default cap, within this server's
    assert code == 0, err
    assert Job.objects.get().preemption_grace_s == 5400
    code, _, err = cli(*submit_args("--grace", "3h"))
    assert code == 2 and "The grace period is 0 to 7,200 seconds (MAX_PREEMPTION_GRACE_S)" in err
    assert Job.objects.count() == 1


def test_the_clis_own_defaults_are_the_servers():
    if str(CLIENT_SRC) not in sys.path:
        sys.path.insert(0, str(CLIENT_SRC))
    from gpuquota_client.limits import DEFAULTS

    from jobs.limits import job_limits

    assert job_limits() == DEFAULTS


def test_an_empty_share_gets_a_real_message_from_the_api_and_the_cli(
    as_bob, vision_share, nodes, cli, config_file
):
    r = as_bob.post(URL, body(share=""), format="json")
    assert r.status_code == 400
    assert r.json()["share"] == ["Give the name of a share. Shares you can submit to: vision-main."]
    config_file.parent.mkdir(parents=True)
    config_file.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "x" * 40}))
    code, _, err = cli("submit", "--share", "", "--gpus", "1", "--gpu-type", "a10g", "--", "true")
    assert code == 2 and "--share: give the name of a share" in err


def test_a_stop_is_never_sent_with_more_than_the_cap(
    bob, vision_share, nodes, no_messages, django_capture_on_commit_callbacks
):
    """A job stored before the cap (or before an operator lowered it) is stopped within today's cap."""
    from jobs.limits import PREEMPTION_GRACE

    job = submit(bob, vision_share)
    Job.objects.filter(pk=job.pk).update(preemption_grace_s=2_147_483_647)
    run(job, nodes[0], [0])
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.cancel(job.pk, by="bob")
    stops = [kw["kwargs"] for name, kw in no_messages if name == PREEMPT]
    assert [s["grace_s"] for s in stops] == [PREEMPTION_GRACE.top] == [3600]
    stopping = Attempt.objects.get(job=job)
    assert stopping.stop_deadline - stopping.stop_requested_at == timedelta(seconds=3600)


# --- cancel ends things: CANCELLING until the processes are gone ----------------------------------


def test_cancel_keeps_the_job_stopping_with_its_gpus_until_its_host_reports(
    as_bob, bob, charlie, language_share, vision_share, nodes, no_messages
):
    """Through the API, the pass and the host's end report: CANCELLING (GPUs held, the snapshot counting
    them as being freed, nothing else placed on them) until the report; then CANCELLED, GPUs free."""
    job = submit(bob, vision_share, gpus=4, preemption_grace_s=600)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    node = attempt.placement[0]["node"]
    lifecycle.mark_started(attempt.pk, attempt.number, node)

    r = as_bob.post(f"{URL}{job.pk}/cancel/")
    assert r.status_code == 200
    assert r.json()["state"] == JobState.CANCELLING
    assert r.json()["state_reason"].startswith(
        "cancelled by bob; stopping attempt 1: SIGTERM now, SIGKILL after 600 s"
    )
    assert r.json()["finished_at"] is None
    assert GpuClaim.objects.filter(attempt=attempt).count() == 4

    running = load_snapshot().snapshot.running
    assert [(v.job_id, v.preempting) for v in running] == [(job.pk, True)]  # in its grace, as a pre-emption
    submit(bob, vision_share, gpus=4)
    submit(charlie, language_share, gpus=2)
    run_pass()  # whatever it places, the stopping job's GPUs stay its own
    held = GpuClaim.objects.filter(gpu__node__name=node).values_list("attempt_id", flat=True)
    assert list(held) == [attempt.pk] * 4
    # A second cancel changes nothing (the job is already stopping).
    assert as_bob.post(f"{URL}{job.pk}/cancel/").json()["state"] == JobState.CANCELLING
    assert as_bob.get(f"{URL}{job.pk}/").json()["state"] == JobState.CANCELLING

    assert attempt_finished(attempt.pk, 1, node, "stopped", -9, "killed at the end of its grace")
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.finished_at is not None
    assert not GpuClaim.objects.filter(attempt=attempt).exists()
    events = [(e["kind"], e["reason"]) for e in as_bob.get(f"{URL}{job.pk}/").json()["events"]]
    assert events[-2][0] == EventKind.CANCEL_REQUESTED
    assert events[-1] == (
        EventKind.CANCELLED,
        "cancelled by bob: attempt 1 ended (killed at the end of its grace); its GPUs are free",
    )


def test_a_pre_empted_job_that_is_cancelled_ends_cancelled_not_requeued(
    bob, vision_share, nodes, no_messages
):
    job = submit(bob, vision_share)
    attempt = run(job, nodes[0], [0])
    lifecycle.request_stop(attempt, grace_s=30, reason="PREEMPTED_RECLAIM by job 99")
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING)
    assert lifecycle.cancel(job.pk, by="bob")
    job.refresh_from_db()
    assert job.state == JobState.CANCELLING and "already stopping (pre-empted)" in job.state_reason
    assert lifecycle.end_attempt(attempt.pk, 1, outcome="PREEMPTED", exit_code=143)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and Attempt.objects.get(pk=attempt.pk).outcome == "CANCELLED"


def test_a_stop_its_host_never_confirms_ends_cancelled_when_it_expires(
    bob, vision_share, nodes, no_messages, settings
):
    job = submit(bob, vision_share, preemption_grace_s=5)
    attempt = run(job, nodes[0], [0])
    lifecycle.cancel(job.pk, by="bob")
    assert expire_stops(timezone.now()) == []  # within grace + PREEMPT_ACK_TIMEOUT_S: still held
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLING and GpuClaim.objects.exists()
    later = timezone.now() + timedelta(seconds=5 + settings.PREEMPT_ACK_TIMEOUT_S + 1)
    assert expire_stops(later) == [attempt.pk]
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and not GpuClaim.objects.exists()


def test_the_pages_show_it_stopping(as_bob, bob, vision_share, nodes, no_messages, client):
    job = submit(bob, vision_share, name="stubborn")
    run(job, nodes[0], [0])
    lifecycle.cancel(job.pk, by="bob")
    client.force_login(bob)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="job-state">CANCELLING<' in page and 'data-testid="stopping"' in page
    assert "Its GPUs stay held until its host reports them gone" in page
    team = client.get("/teams/vision/?part=queue", HTTP_HX_REQUEST="true").content.decode()
    row = team[team.index(f'<tr data-job="{job.pk}"') :]
    row = row[: row.index("</tr>")]
    assert "state-cancelling" in row and ">CANCELLING<" in row and "Cancel job" not in row


def test_the_cli_says_it_is_stopping_and_wait_waits_for_cancelled(
    cli, live_server, bob, vision_share, nodes, no_messages
):
    code, _, err = cli("login", live_server.url, "-u", "bob", "--password-stdin", stdin="bob-pw-123\n")
    assert code == 0, err
    job = submit(bob, vision_share)
    attempt = run(job, nodes[0], [0])
    code, out, _ = cli("cancel", job.pk)
    assert code == 0
    assert out.startswith(f"Cancelling job {job.pk}: CANCELLING (cancelled by bob; stopping attempt 1")
    assert f"`gpuquota wait {job.pk}` waits until it is CANCELLED." in out
    code, out, _ = cli("status", job.pk)
    assert out.startswith(f"job {job.pk}: CANCELLING")
    code, _, err = cli("wait", job.pk, "--timeout", "1s", "--poll", "0.2")
    assert code == 1 and "still CANCELLING" in err
    lifecycle.end_attempt(attempt.pk, 1, outcome="PREEMPTED", exit_code=143)
    code, out, _ = cli("wait", job.pk, "--poll", "0.05")
    assert code == 1 and out.startswith(f"job {job.pk}: CANCELLED")


def test_cancelling_every_task_of_an_array_leaves_the_running_ones_stopping(as_bob, bob, vision_share, nodes):
    r = as_bob.post(URL, body(array={"size": 3}), format="json")
    array = r.json()["id"]
    first = Job.objects.filter(array_id=array).order_by("array_index").first()
    attempt = run(first, nodes[0], [0])
    r = as_bob.post(f"/api/v1/arrays/{array}/cancel/")
    assert r.json()["counts"] == {"CANCELLED": 2, "CANCELLING": 1} and not r.json()["done"]
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.STOPPING


def test_a_member_of_another_team_cannot_cancel(bob, charlie, vision_share, nodes):
    job = submit(bob, vision_share)
    assert client_for(charlie).post(f"{URL}{job.pk}/cancel/").status_code == 404
