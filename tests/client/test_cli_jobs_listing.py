"""`gpuquota jobs`: a page at a time (`| head -3` no longer waits for every page), --limit and --since,
and help for each option."""

import json
import os
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.core.signals import request_started
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from tests.api.conftest import submit
from tests.client.conftest import CLIENT_SRC


def test_jobs_prints_each_page_before_asking_for_the_next(logged_in, bob, vision_share, config_file):
    for i in range(201):  # three pages of 100
        submit(bob, vision_share, name=f"j{i}")
    pages, reader_gone = [], threading.Event()

    def listing(sender, environ, **kwargs):
        if environ["PATH_INFO"] == "/api/v1/jobs/":
            pages.append(environ.get("QUERY_STRING", ""))
            if len(pages) == 2:  # the second page waits until the reader has stopped reading
                reader_gone.wait(30)

    request_started.connect(listing)
    try:
        env = dict(os.environ, PYTHONPATH=str(CLIENT_SRC), GPUQUOTA_CONFIG=str(config_file))
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuquota_client", "jobs", "--all-states"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # `| head -3`: the first lines arrive before any second page is answered.
        first = [process.stdout.readline() for _ in range(3)]
        process.stdout.close()
        reader_gone.set()
        assert process.wait(60) == 141 and process.stderr.read() == b""
    finally:
        reader_gone.set()
        request_started.disconnect(listing)
    assert first[0].split()[:2] == [b"ID", b"NAME"] and b"j200" in first[1]
    # Never the third page; the second only if it was asked for before the closed pipe was noticed.
    assert 1 <= len(pages) <= 2, pages


def test_limit_gives_the_newest_jobs_in_one_short_page(logged_in, bob, vision_share):
    jobs = [submit(bob, vision_share, name=f"j{i}") for i in range(5)]
    asked = []

    def listing(sender, environ, **kwargs):
        if environ["PATH_INFO"] == "/api/v1/jobs/":
            asked.append(environ.get("QUERY_STRING", ""))

    request_started.connect(listing)
    try:
        code, out, err = logged_in("--json", "jobs", "--limit", 2)
    finally:
        request_started.disconnect(listing)
    assert code == 0, err
    assert [j["id"] for j in json.loads(out)] == [jobs[4].pk, jobs[3].pk]
    assert len(asked) == 1 and "limit=2" in asked[0]


def test_since_a_duration_or_a_time_stops_at_older_jobs(logged_in, bob, vision_share):
    now = timezone.now()
    ages = {"new": 10, "hour": 50, "day": 60 * 30, "old": 60 * 24 * 3}  # minutes
    for name, minutes in ages.items():
        job = submit(bob, vision_share, name=name)
        Job.objects.filter(pk=job.pk).update(
            submitted_at=now - timedelta(minutes=minutes), state=JobState.FAILED
        )
    code, out, err = logged_in("--json", "jobs", "--all-states", "--since", "1h")
    assert code == 0, err
    assert [j["name"] for j in json.loads(out)] == ["new", "hour"]
    since = (now - timedelta(days=2)).astimezone().strftime("%Y-%m-%dT%H:%M")
    code, out, _ = logged_in("--json", "jobs", "--all-states", "--since", since)
    assert [j["name"] for j in json.loads(out)] == ["new", "hour", "day"]
    code, out, _ = logged_in("jobs", "--all-states", "--since", "5m")
    assert out.split() == ["ID", "NAME", "SHARE", "USER", "GPUS", "PRIO", "STATE", "SUBMITTED"]


@pytest.mark.parametrize("bad", [("--limit", "0"), ("--limit", "x"), ("--since", "yesterday")])
def test_a_bad_limit_or_since_is_a_usage_error(logged_in, bad):
    with pytest.raises(SystemExit) as exc:
        logged_in("jobs", *bad)
    assert exc.value.code == 2


def test_every_jobs_option_has_help(cli, capsys):
    with pytest.raises(SystemExit):
        cli("jobs", "--help")
    text = " ".join(capsys.readouterr().out.split())
    for option, words in [
        ("--all-states", "also jobs that have ended"),
        ("--share SHARE", "only jobs of this share"),
        ("--limit N", "at most N jobs, the newest"),
        ("--since WHEN", "only jobs submitted since then"),
    ]:
        assert f"{option} {words}" in text, option
