"""The CLI: arrays (submit --array, status/priority/cancel/wait A<id>), --grace, what `wait` says about
a failure, a rejected token, control characters in tables, a closed pipe, and a quick --version."""

import os
import subprocess
import sys
import time

import pytest

from jobs.choices import JobState
from jobs.models import Job, JobArray
from tests.api.conftest import submit
from tests.client.conftest import CLIENT_SRC

SUBMIT = ("submit", "--share", "vision-main", "--gpus", 1, "--gpu-type", "a10g")


def test_submit_array_creates_one_task_per_index(logged_in):
    code, out, err = logged_in(*SUBMIT, "--array", "0-999", "--name", "sweep", "--", "python", "sweep.py")
    assert code == 0, err
    array = JobArray.objects.get()
    assert out.startswith(f"Submitted array A{array.pk} sweep (1000 tasks, index 0-999, share vision-main)")
    assert "1000 queued" in out
    assert Job.objects.filter(array=array).count() == 1000
    assert Job.objects.get(array=array, array_index=999).env == {"GPUQUOTA_ARRAY_INDEX": "999"}


@pytest.mark.parametrize("bad", ["5-2", "x", "-3", "0"])
def test_a_bad_array_range_is_a_usage_error(logged_in, bad):
    with pytest.raises(SystemExit) as exc:
        logged_in(*SUBMIT, "--array", bad, "--", "true")
    assert exc.value.code == 2


def test_status_priority_cancel_and_wait_of_an_array(logged_in):
    logged_in(*SUBMIT, "--array", "3", "--", "true")
    array = JobArray.objects.get()
    code, out, _ = logged_in("status", f"A{array.pk}")
    assert code == 0 and "3 queued" in out
    code, out, _ = logged_in("priority", f"a{array.pk}", 9)
    assert code == 0 and set(Job.objects.values_list("priority", flat=True)) == {9}
    code, out, _ = logged_in("jobs", "--array", f"A{array.pk}")
    assert len(out.splitlines()) == 4 and f"[A{array.pk}:2]" in out
    code, out, _ = logged_in("cancel", f"A{array.pk}")
    assert code == 0 and "3 cancelled" in out and "done" in out
    code, out, _ = logged_in("wait", f"A{array.pk}", "--poll", 0.01)
    assert code == 1  # not every task succeeded
    assert logged_in("cancel", f"A{array.pk}")[0] == 2


def test_submit_sets_the_grace(logged_in):
    assert logged_in(*SUBMIT, "--grace", "5m", "--", "true")[0] == 0
    assert logged_in(*SUBMIT, "--grace", "0", "--", "true")[0] == 0
    assert sorted(Job.objects.values_list("preemption_grace_s", flat=True)) == [0, 300]


def test_wait_on_a_failure_prints_its_exit_code(logged_in, bob, vision_share):
    job = submit(bob, vision_share)
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED, exit_code=3, state_reason="exit code 3")
    code, out, _ = logged_in("wait", job.pk, "--poll", 0.01)
    assert code == 1 and out == f"job {job.pk}: FAILED, exit code 3\n"  # not "(exit code 3)" again
    Job.objects.filter(pk=job.pk).update(state_reason="could not start '/x/train.py': not found")
    code, out, _ = logged_in("wait", job.pk, "--poll", 0.01)
    assert out == f"job {job.pk}: FAILED, exit code 3 (could not start '/x/train.py': not found)\n"


def test_a_missing_array_is_said_in_words(logged_in):
    code, _, err = logged_in("status", "A999999")
    assert code == 2 and "No such job array." in err


def test_a_rejected_token_says_to_log_in_again(logged_in, config_file, monkeypatch):
    monkeypatch.setenv("GPUQUOTA_TOKEN", "not-a-token")
    code, _, err = logged_in("jobs")
    assert code == 2 and "Run `gpuquota login URL` to log in again." in err


def test_control_characters_are_escaped_in_tables(logged_in, bob, vision_share):
    submit(bob, vision_share, name="evil\x1b[2J\x07\nname")
    code, out, _ = logged_in("jobs")
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b[2J\\x07\\nname" in out
    assert len(out.splitlines()) == 2


def cli_process(config_file, *args, **kw):
    env = dict(os.environ, PYTHONPATH=str(CLIENT_SRC), GPUQUOTA_CONFIG=str(config_file))
    return subprocess.run([sys.executable, "-m", "gpuquota_client", *args], env=env, **kw)


def test_piped_into_head_it_stops_quietly(logged_in, bob, vision_share, config_file):
    for _ in range(3):
        submit(bob, vision_share, name="x" * 150)
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    reader.stdin.close()  # the reader is gone before the CLI writes a byte
    reader.wait()
    env = dict(os.environ, PYTHONPATH=str(CLIENT_SRC), GPUQUOTA_CONFIG=str(config_file))
    r, w = os.pipe()
    os.close(r)
    done = subprocess.run(
        [sys.executable, "-m", "gpuquota_client", "jobs"],
        env=env,
        stdout=w,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    os.close(w)
    assert done.stderr == b""  # no BrokenPipeError traceback
    assert done.returncode == 141


def test_version_is_quick_and_imports_no_http(config_file):
    started = time.perf_counter()
    done = cli_process(config_file, "--version", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("gpuquota ")
    assert time.perf_counter() - started < 2  # generous for a loaded CI machine; the bench measures it
    probe = cli_process(
        config_file,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 2  # no command: usage
    env = dict(os.environ, PYTHONPATH=str(CLIENT_SRC))
    code = (
        "import sys; from gpuquota_client import cli; "
        "bad = [m for m in ('requests', 'socket', 'gpuquota_client.client', 'datetime') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
