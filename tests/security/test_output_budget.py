"""Issue 41, item 8: 20 tasks stored 168 MB of output in 30 s, with no bound per user or team. Now a
team's stored output stops at TEAM_OUTPUT_MAX_BYTES (each attempt's log says where it was cut), and
what a node ships waits on the broker within its node's bounds (config.redisbroker.Intake), so neither
the control queue nor Redis grows with it."""

import shutil

import pytest

from config.redisbroker import Intake
from jobs.models import LogChunk, OctetLength, TeamOutput
from jobs.tasks import attempt_log
from tests.jobs.test_output_budget import running, sent  # noqa: F401 - fixture
from tests.security.broker_helpers import ConfiguredRedis

MIB = 2**20
CHUNK = ("y" * 1023 + "\n") * 64  # 64 KiB, the agent's chunk (runner.LOG_CHUNK_BYTES)


def stored(team) -> int:
    return sum(
        LogChunk.objects.filter(attempt__job__share__team=team, cut=False)
        .annotate(size=OctetLength("text"))
        .values_list("size", flat=True)
    )


def test_twenty_printing_tasks_store_no_more_than_their_teams_budget(
    bob,
    charlie,
    vision,
    language,
    vision_share,
    language_share,
    nodes,
    sent,  # noqa: F811
    settings,
):
    settings.TEAM_OUTPUT_MAX_BYTES = 8 * MIB
    attempts = [running(bob, vision_share, nodes[0]) for _ in range(20)]
    for i in range(64):  # 4 MiB each, as fast as they come: 80 MiB in all
        for attempt in attempts:
            attempt_log(attempt.pk, 1, "node-1", i * len(CHUNK), CHUNK)
    assert stored(vision) <= 8 * MIB
    assert TeamOutput.objects.get(team=vision).bytes == stored(vision)
    # Every attempt's log says where its output was cut (once), and the other team still stores its own.
    assert LogChunk.objects.filter(cut=True).count() == 20
    assert set(LogChunk.objects.filter(cut=True).values_list("attempt_id", flat=True)) == {
        a.pk for a in attempts
    }
    other = running(charlie, language_share, nodes[0])
    assert all(attempt_log(other.pk, 1, "node-1", i * len(CHUNK), CHUNK) for i in range(16))
    assert stored(language) == 16 * len(CHUNK)


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary")
def test_a_node_shipping_output_faster_than_it_is_stored_stays_within_its_bounds_on_the_broker(tmp_path):
    from kombu import Connection

    from config.celery import app

    server = ConfiguredRedis(tmp_path, maxmemory="1gb").start()
    try:
        admin, node = server.admin(), server.add_node("gpu-1")
        with Connection(server.url) as conn:  # one chunk as the agent sends it, encoded
            type(app).send_task(
                app,
                "jobs.tasks.attempt_log",
                kwargs={"attempt_id": 1, "number": 1, "node": "gpu-1", "offset": 0, "text": CHUNK},
                queue="scratch",
                connection=conn,
                serializer="json",
            )
        message = admin.rpop("scratch")
        intake = Intake(admin)  # the defaults: 200 waiting on control, 16 MiB per node
        pipe = node.pipeline(transaction=False)
        for _ in range(20 * 64):  # 20 attempts' 4 MiB each: 80 MiB of output, about 110 MB encoded
            pipe.lpush("control.from.gpu-1", message)
        pipe.execute()
        intake.discover()
        intake.police()
        assert admin.memory_usage("control.from.gpu-1", samples=0) <= 16 * MIB  # its newest
        pipe = node.pipeline(transaction=False)
        for _ in range(500):  # and more while the control worker is busy
            pipe.lpush("control.from.gpu-1", message)
        pipe.execute()
        for _ in range(10):
            intake.round()
            intake.police()
        assert admin.llen("control") <= 200  # the control worker's backlog, whatever the node sent
        assert (admin.memory_usage("control.from.gpu-1", samples=0) or 0) <= 16 * MIB
        assert admin.info("memory")["used_memory"] < 64 * MIB
    finally:
        server.stop()


def test_a_cut_attempts_host_ships_no_more_of_its_output(tmp_path, monkeypatch):
    """Backpressure: told that its output is cut, the agent stops shipping it (a job printing as fast as
    it can shipped 64 KiB chunks until its 4 MiB head was out, each one refused on the control side)."""
    import sys
    import time

    from gpunodes.agent import tasks as agent_tasks
    from gpunodes.agent.runner import LOG
    from tests.gpunodes.test_runner import Reports, make_runner, start, wait_finished

    reports = Reports()
    runner = make_runner(tmp_path, reports)
    monkeypatch.setattr(agent_tasks, "RUNNER", runner)
    try:
        printer = (
            "import sys, time\nfor i in range(400):\n    print('y' * 4000, flush=True); time.sleep(0.005)"
        )
        assert start(runner, [sys.executable, "-c", printer]) == "started"
        while not reports.of(LOG):
            runner.poll()
            time.sleep(0.05)
        assert agent_tasks.log_cut(node="n1", attempt_id=1, number=2) == "not running"  # another number
        assert agent_tasks.log_cut(node="other", attempt_id=1, number=1) == "refused"
        assert agent_tasks.log_cut(node="n1", attempt_id=1, number=1) == "stopped"
        shipped = len(reports.of(LOG))
        wait_finished(runner, reports)
        assert len(reports.of(LOG)) == shipped  # nothing more, not even the end's tail
    finally:
        runner.shutdown(grace_s=1)
