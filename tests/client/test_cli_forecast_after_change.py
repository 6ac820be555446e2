"""`gpuquota submit` (at a terminal or with --forecast) and `gpuquota priority` print the job's position
and ETA from a stored forecast made after the change, waiting a few seconds for the pass the change asked
for; a job that started meanwhile is said to be starting; none in time is said plainly, exit code 0.
Here the pass a change asks for runs at once, in the live server's request (its forecast with it)."""

import time

import pytest
from django.core.cache import cache

from jobs.models import Job
from quotas import services, tasks, triggers
from tests.api.conftest import run, submit

SUBMIT = ("submit", "--share", "vision-main", "--gpus", 4, "--gpu-type", "a10g", "--name", "big")


@pytest.fixture
def passes_run(monkeypatch, settings):
    """From when it is called (the jobs set up before it had no pass): the pass a change asks for runs
    in the request that made it (and forecasts the queue after it); the CLI waits its own time, reading
    the job often. The last stored forecast was made a while ago, not counting the change."""

    def start():
        settings.FORECAST_MIN_INTERVAL_S = 3
        triggers._coalescer.settle()  # the set-up's submits: no trailing request into the pass swapped in
        monkeypatch.setattr(triggers, "request_pass", lambda why="": tasks.scheduling_pass(why))
        monkeypatch.setattr(triggers, "_coalescer", triggers._Coalescer())  # a lone submit asks at once
        monkeypatch.setattr("gpuquota_client.cli.FORECAST_WAIT_S", 10.0)
        monkeypatch.setattr("gpuquota_client.cli.FORECAST_POLL_S", 0.05)
        cache.set(tasks.FORECAST_LAST, time.time() - 10, None)
        cache.delete(tasks.FORECAST_ASKED)

    return start


@pytest.fixture
def full(bob, vision_share, nodes):
    """Both nodes taken by vision's jobs: a new 4-GPU job waits."""
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=4), nodes[1], [0, 1, 2, 3], borrowed=True)
    return vision_share


def test_submit_with_forecast_prints_its_position_and_eta(passes_run, logged_in, full):
    passes_run()
    code, out, err = logged_in(*SUBMIT, "--forecast", "--", "python", "train.py")
    assert code == 0, err
    job = Job.objects.get(name="big", state="QUEUED")
    assert out.startswith(f"Submitted job {job.pk} big: QUEUED, #1 in vision-main, #1 overall")
    assert "[estimate" in out  # an ETA, and what it rests on (the running jobs' runtimes are guesses)
    assert "not forecast yet" not in out and "no forecast yet" not in out


def test_priority_prints_the_new_position_not_the_old_one(passes_run, logged_in, bob, full):
    submit(bob, full, gpus=4)
    second = submit(bob, full, gpus=4, name="urgent")
    services.forecast_refresh()
    passes_run()
    code, out, err = logged_in("priority", second.pk, 50)
    assert code == 0, err
    assert out.startswith(f"Priority of job {second.pk} is now 50: job {second.pk} urgent: QUEUED, #1 in")


def test_priority_of_a_job_that_then_starts_says_it_is_starting(passes_run, logged_in, bob, vision_share):
    job = submit(bob, vision_share, gpus=2, name="quick")  # its pass did not run: still queued
    services.forecast_refresh()
    passes_run()
    code, out, err = logged_in("priority", job.pk, 7)
    assert code == 0, err
    assert Job.objects.get(pk=job.pk).state == "ADMITTED"
    assert f"job {job.pk} quick: ADMITTED (started: its GPUs are assigned and it is starting)" in out
    assert " in vision-main" not in out  # no position of a queued job


def test_no_forecast_in_time_is_said_plainly_with_exit_code_0(logged_in, bob, full):
    # No pass runs here: the stored forecast still has the job second, before its priority change.
    submit(bob, full, gpus=4)
    second = submit(bob, full, gpus=4, name="urgent")
    services.forecast_refresh()
    code, out, _ = logged_in("priority", second.pk, 50)
    assert code == 0
    assert f"job {second.pk} urgent: QUEUED; no forecast yet: " in out
    assert "#2 in" not in out and "[estimate" not in out  # not the forecast of before the change
    code, out, _ = logged_in(*SUBMIT, "--forecast", "--", "true")
    assert code == 0 and "QUEUED; no forecast yet: " in out
