"""A start sent again while its image is being pulled (the heartbeat resends a start that is not
reported running within seconds) returns at once as a duplicate, holding none of the agent's threads;
once the pull ended, the attempt starts or ends once (no podman needed)."""

import shutil
import threading
import time

from tests.security.agent_helpers import Reports, job_root, make_runner


def test_a_start_resent_during_the_pull_is_a_duplicate_at_once(monkeypatch):
    reports = Reports()
    root = job_root()
    runner = make_runner(root, reports, podman=None)
    release, pulling = threading.Event(), threading.Event()

    def slow_pull(image, say, words):
        pulling.set()
        release.wait(10)
        return "could not pull image reg.example.com/x:1: manifest unknown", None

    monkeypatch.setattr(runner, "_prepare_image", slow_pull)
    answers = []
    start = dict(attempt_id=1, number=1, job_id=7, command=["true"], image="reg.example.com/x:1")
    first = threading.Thread(target=lambda: answers.append(runner.start(**start)))
    first.start()
    assert pulling.wait(10)
    began = time.monotonic()
    assert runner.start(**start) == "duplicate"
    assert time.monotonic() - began < 0.5
    release.set()
    first.join(10)
    assert answers == ["failed"]
    [end] = [k for k in reports.of("jobs.tasks.attempt_finished")]
    assert end["how"] == "failed_to_start" and "manifest unknown" in end["detail"]
    assert runner.start(**start) == "duplicate"  # ended: never again
    runner.shutdown(grace_s=0)
    shutil.rmtree(root, ignore_errors=True)
