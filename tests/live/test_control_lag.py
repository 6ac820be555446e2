"""The control queue keeps up: 8 agents heartbeating every 2 s, the beat's passes and the demo's traffic,
and a message put on the control queue is handled within a second (the embedded default: SQLite and
the file broker, unless DATABASE_URL / REDIS_URL say otherwise)."""

import statistics
import sys
import time

import pytest
from django.core.management import call_command

from config.celery import CONTROL_QUEUE, app
from gpunodes.choices import NodeState
from gpunodes.models import Node
from gpunodes.services import fake_inventory, node_register
from tests.live.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

AGENTS = 8
PROBE = "lag-probe"


def probe_lag(timeout: float = 20.0) -> float:
    """Put a heartbeat of the (cordoned) probe node on the control queue; seconds until it is handled."""
    sent = time.time()
    app.send_task(
        "gpunodes.tasks.node_heartbeat",
        kwargs={
            "name": PROBE,
            "gpu_type": "a10g",
            "inventory": [g.__dict__ for g in fake_inventory(PROBE, 1)],
            "running": [],
            "boot_id": "00000000000000-probe",
            "sent_at": sent,
        },
        queue=CONTROL_QUEUE,
    )

    def handled():
        seen = Node.objects.filter(name=PROBE).values_list("last_heartbeat", flat=True).first()
        return seen.timestamp() if seen and seen.timestamp() >= sent else None

    return wait_for(handled, timeout, every=0.02, what="the probe heartbeat") - sent


def test_the_control_queue_lags_under_a_second_with_8_agents_and_demo_traffic(cluster):
    call_command("seed_demo", verbosity=0)
    node_register(name=PROBE, gpu_type="a10g", gpus=fake_inventory(PROBE, 1), state=NodeState.CORDONED)
    cluster.env.update(HEARTBEAT_INTERVAL_S="2", SCHEDULER_INTERVAL_S="2", NODE_LOST_AFTER_S="30")
    cluster.start_control_plane()
    names = [f"gpu-{i}" for i in range(1, AGENTS + 1)]
    for name in names:
        cluster.start_agent(name, 4)
    cluster._spawn("demo", [sys.executable, "manage.py", "demo_traffic", "--delay", "0", "--every", "5"])
    wait_for(
        lambda: Node.objects.filter(name__in=names, state=NodeState.READY).count() == AGENTS,
        120,
        every=0.5,
        what=f"{AGENTS} READY nodes",
    )
    probe_lag(60)  # the control worker is up and has caught up with the start

    lags = []
    end = time.monotonic() + 10  # two of demo_traffic's submits
    while time.monotonic() < end:
        lags.append(probe_lag())
        time.sleep(0.25)
    lags.sort()
    print(
        f"control queue lag over {len(lags)} probes: median {statistics.median(lags):.3f} s, "
        f"p95 {lags[int(len(lags) * 0.95)]:.3f} s, max {lags[-1]:.3f} s"
    )
    assert Node.objects.filter(name__in=names, state=NodeState.READY).count() == AGENTS
    assert lags[-1] < 1.0, f"the control queue lagged {lags[-1]:.2f} s"
