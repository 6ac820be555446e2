"""Issue 41 item 3: host log files were bounded per attempt only (8 MiB each, kept 7 days), so one
member's many attempts filled the agent's disk. Before an attempt starts, the finished log files of its
job, then of its owner's jobs, go oldest first past their budgets; a live attempt's log is never
touched, nor another owner's."""

import os
import time

from gpunodes.agent.joblog import OWNER_FILE, bound_host_logs

MiB = 1 << 20


def log_file(root, job, number, *, owner=None, size=1 * MiB, age_s=0.0):
    d = root / f"job-{job}"
    d.mkdir(exist_ok=True)
    if owner is not None:
        (d / OWNER_FILE).write_text(str(owner))
    f = d / f"attempt-{number}.n1.log"
    f.write_bytes(b"x" * size)
    at = time.time() - age_s
    os.utime(f, (at, at))
    return f


def bound(root, job, user, live=(), per_job=0, per_user=0):
    return bound_host_logs(
        root,
        job_id=job,
        user=user,
        live=set(live),
        cap_bytes=1 * MiB,
        per_job_bytes=per_job,
        per_user_bytes=per_user,
    )


def test_a_jobs_oldest_logs_go_past_its_budget(tmp_path):
    files = [log_file(tmp_path, 7, n, age_s=100 - n) for n in range(1, 6)]  # 5 MiB, the first the oldest
    assert bound(tmp_path, 7, None, per_job=3 * MiB) == 3  # 2 kept + room for the next one's 1 MiB
    assert [f.exists() for f in files] == [False, False, False, True, True]


def test_an_owners_logs_are_bounded_across_their_jobs_and_no_one_elses(tmp_path):
    mine = [log_file(tmp_path, job, 1, owner=42, age_s=100 - job) for job in range(1, 5)]
    theirs = log_file(tmp_path, 9, 1, owner=43, age_s=1000)
    live = log_file(tmp_path, 1, 2, owner=42, age_s=2000)  # running: never removed
    assert bound(tmp_path, 5, 42, live=[live], per_user=3 * MiB) == 2
    assert [f.exists() for f in mine] == [False, False, True, True]
    assert theirs.exists() and live.exists()
    assert (tmp_path / "job-5" / OWNER_FILE).read_text() == "42"  # the new job's owner, written down


def test_zero_is_no_bound(tmp_path):
    files = [log_file(tmp_path, 7, n, owner=42) for n in range(1, 4)]
    assert bound(tmp_path, 7, 42) == 0 and all(f.exists() for f in files)


def test_the_start_carries_the_jobs_owner(db, bob, vision_share, nodes, monkeypatch):
    from gpunodes.dispatch import start_messages
    from jobs.choices import AttemptState
    from jobs.models import Attempt
    from jobs.services import job_submit

    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)
    job = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    attempt = Attempt.objects.create(
        job=job, number=1, state=AttemptState.ADMITTED, placement=[{"node": "node-1", "gpus": [0]}]
    )
    assert [m["payload"]["user"] for m in start_messages([attempt.pk])] == [bob.pk]
