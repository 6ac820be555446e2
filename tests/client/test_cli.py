"""The `gpuquota` CLI against a live server: log in, look, submit, watch, change, cancel."""

import json
import os
import stat
import subprocess
import sys

import pytest
from django.utils import timezone

from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job, LogChunk
from tests.api.conftest import run, submit
from tests.client.conftest import CLIENT_SRC


def test_login_stores_the_token_readable_by_the_user_only(cli, live_server, bob, config_file):
    code, out, _ = cli("login", live_server.url, "-u", "bob", "--password-stdin", stdin="bob-pw-123\n")
    assert code == 0
    assert "Logged in" in out
    saved = json.loads(config_file.read_text())
    assert saved["url"] == live_server.url and len(saved["token"]) == 40
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600


def test_a_wrong_password_exits_2_with_the_servers_message(cli, live_server, bob, config_file):
    code, _, err = cli("login", live_server.url, "-u", "bob", "--password-stdin", stdin="nope\n")
    assert code == 2
    assert "Unable to log in with provided credentials." in err
    assert not config_file.exists()


def test_commands_before_login_say_how_to_log_in(cli, config_file):
    code, _, err = cli("shares")
    assert code == 2
    assert "gpuquota login URL" in err


def test_shares_table_and_json(logged_in):
    code, out, _ = logged_in("shares")
    assert code == 0
    assert out.splitlines()[0].split()[:4] == ["SHARE", "TEAM", "STRATEGY", "STATE"]
    assert "vision-main" in out and "0/4 a10g" in out
    code, out, _ = logged_in("--json", "shares")
    assert [s["name"] for s in json.loads(out)] == ["vision-main"]


def test_submit_then_status_queue_priority_and_cancel(logged_in, bob):
    code, out, err = logged_in(
        "submit",
        "--share",
        "vision-main",
        "--gpus",
        2,
        "--gpu-type",
        "a10g",
        "--priority",
        5,
        "--name",
        "resnet",
        "--max-runtime",
        "2h",
        "-e",
        "SEED=1",
        "--",
        "python",
        "train.py",
        "--epochs",
        "3",
    )
    assert code == 0, err
    job = Job.objects.get()
    assert out.startswith(f"Submitted job {job.pk} resnet: QUEUED")
    assert (job.command, job.env, job.max_runtime_s, job.priority, job.gpus) == (
        ["python", "train.py", "--epochs", "3"],
        {"SEED": "1"},
        7200,
        5,
        2,
    )

    code, out, _ = logged_in("status", job.pk)
    assert code == 0 and "python train.py --epochs 3" in out and "SUBMITTED" in out

    code, out, _ = logged_in("--json", "queue", "vision-main")
    assert [j["id"] for j in json.loads(out)["jobs"]] == [job.pk]
    code, out, _ = logged_in("queue", "vision-main")
    assert "EXPECTED START" in out and "resnet" in out

    code, out, _ = logged_in("priority", job.pk, 42)
    assert code == 0 and "is now 42" in out
    code, out, _ = logged_in("cancel", job.pk)
    assert code == 0 and "CANCELLED" in out
    job.refresh_from_db()
    assert (job.priority, job.state) == (42, JobState.CANCELLED)


def test_server_refusals_exit_2_with_its_message(logged_in, nodes):
    code, _, err = logged_in(
        "submit", "--share", "vision-main", "--gpus", 16, "--gpu-type", "a10g", "--", "true"
    )
    assert code == 2
    assert "gpus: 16 GPUs need 4 whole 4-GPU a10g nodes but only 2 exist." in err
    code, _, err = logged_in("submit", "--share", "nope", "--gpus", 1, "--gpu-type", "a10g", "--", "true")
    assert code == 2 and 'No share named "nope"' in err
    code, _, err = logged_in("status", 999999)
    assert code == 2
    assert "No such job." in err


def test_cancelling_a_finished_job_exits_2_saying_why(logged_in, bob, vision_share):
    job = submit(bob, vision_share)
    logged_in("cancel", job.pk)
    code, _, err = logged_in("cancel", job.pk)
    assert code == 2
    assert "has already ended (CANCELLED); there is nothing to cancel." in err


def test_a_submit_without_a_command_is_a_usage_error(logged_in):
    code, _, err = logged_in("submit", "--share", "vision-main", "--gpus", 1, "--gpu-type", "a10g")
    assert code == 2 and "give the command after --" in err


def test_a_bad_max_runtime_is_a_usage_error(logged_in):
    with pytest.raises(SystemExit) as exit_:
        logged_in(
            "submit",
            "--share",
            "vision-main",
            "--gpus",
            1,
            "--gpu-type",
            "a10g",
            "--max-runtime",
            "soon",
            "--",
            "true",
        )
    assert exit_.value.code == 2


def test_jobs_lists_open_jobs_unless_all_states(logged_in, bob, vision_share):
    open_job = submit(bob, vision_share, name="open")
    done = submit(bob, vision_share, name="done")
    Job.objects.filter(pk=done.pk).update(state=JobState.SUCCEEDED)
    code, out, _ = logged_in("--json", "jobs")
    assert [j["id"] for j in json.loads(out)] == [open_job.pk]
    code, out, _ = logged_in("--json", "jobs", "--all-states")
    assert sorted(j["id"] for j in json.loads(out)) == sorted([open_job.pk, done.pk])
    code, out, _ = logged_in("jobs")
    assert "open" in out and "done" not in out


def test_logs_and_follow_until_the_job_ends(logged_in, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    attempt = run(job, nodes[0], [0])
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=0, text="step 1\nstep 2\n")
    code, out, _ = logged_in("logs", job.pk, "--tail", 1)
    assert out == "step 2\n"
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=14, text="done\n")
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.ENDED, outcome="SUCCEEDED", ended_at=timezone.now()
    )
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    code, out, _ = logged_in("logs", job.pk, "-f", "--poll", 0.01)
    assert code == 0
    assert out == "step 1\nstep 2\ndone\n"


def test_wait_exits_0_for_success_and_1_otherwise(logged_in, bob, vision_share):
    ok = submit(bob, vision_share)
    Job.objects.filter(pk=ok.pk).update(state=JobState.SUCCEEDED)
    assert logged_in("wait", ok.pk, "--poll", 0.01)[0] == 0
    cancelled = submit(bob, vision_share)
    logged_in("cancel", cancelled.pk)
    code, out, _ = logged_in("wait", cancelled.pk, "--poll", 0.01)
    assert code == 1 and "CANCELLED" in out


def test_wait_gives_up_after_its_timeout(logged_in, bob, vision_share):
    job = submit(bob, vision_share)
    code, _, err = logged_in("wait", job.pk, "--timeout", "1s", "--poll", 0.2)
    assert code == 1 and "still QUEUED" in err


def test_logout_revokes_the_token(logged_in, config_file):
    assert logged_in("logout")[0] == 0
    assert not config_file.exists()


def test_an_unreachable_server_exits_1(cli, config_file, monkeypatch):
    monkeypatch.setenv("GPUQUOTA_URL", "http://127.0.0.1:9")
    code, _, err = cli("shares")
    assert code == 1 and "cannot reach" in err


def test_the_command_runs_as_a_process(live_server, bob, vision_share, nodes, config_file):
    env = dict(os.environ, PYTHONPATH=str(CLIENT_SRC), GPUQUOTA_CONFIG=str(config_file))
    cmd = [sys.executable, "-m", "gpuquota_client"]
    login = subprocess.run(
        [*cmd, "login", live_server.url, "-u", "bob", "--password-stdin"],
        input="bob-pw-123\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert login.returncode == 0, login.stderr
    refused = subprocess.run(
        [*cmd, "submit", "--share", "vision-main", "--gpus", "6", "--gpu-type", "a10g", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2  # refused by the server
    assert "gpus: 6 GPUs do not fit on one a10g node" in refused.stderr
