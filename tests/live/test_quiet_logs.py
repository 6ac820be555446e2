"""An idle cluster is quiet at INFO: passes that decide nothing, heartbeats and the beat's sends write no
log lines (the credentials `make run` prints are not buried under them)."""

import time

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from tests.live.conftest import wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def log_lines(cluster) -> dict[str, list[str]]:
    return {p.stem: p.read_text(errors="replace").splitlines() for p in cluster.tmp.glob("*.log")}


def test_an_idle_cluster_writes_no_log_lines_at_info(cluster):
    cluster.start_control_plane()  # a pass every second, a heartbeat every second
    cluster.start_agent("quiet-1", 2)
    wait_for(lambda: Node.objects.filter(name="quiet-1", state=NodeState.READY).exists(), 60, what="READY")
    time.sleep(2)  # start-up lines are over
    before = log_lines(cluster)
    time.sleep(6)
    after = log_lines(cluster)
    new = {name: lines[len(before.get(name, [])) :] for name, lines in after.items()}
    assert {name: lines for name, lines in new.items() if lines} == {}
    # An agent runs as root by design (a uid per job): Celery's warning about a root worker is not
    # said there (gpunodes/agent/main.py), here or in `make run`.
    assert not [line for line in after["agent-quiet-1"] if "superuser privileges" in line]
