"""Rendezvous ports (issue 41, item 5). Before: any job could bind all of RENDEZVOUS_PORTS; another team's
rank 0 then could not bind its port and its other ranks talked to the squatter (torch's TCPStore has no
authentication). Now each attempt may bind only its own port of the range (a bind program on its cgroup),
and rank 0's agent checks that its port is free before the start: where something else holds it, the
start is refused with no strike and the job re-queued on a fresh port. Real processes, a root agent."""

import random
import socket

import pytest

from gpunodes.agent import runner as runner_module
from tests.security.agent_helpers import as_root, job_python, make_runner, uid_pool, wait_until

pytestmark = as_root

# Binds (and listens on) every port of the range it can; says how many.
SQUAT = """
import socket, sys, time
low, high = int(sys.argv[1]), int(sys.argv[2])
held, ports = [], set()
for port in range(low, high + 1):
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        s = socket.socket(family)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            s.bind((address, port)); s.listen(); held.append(s); ports.add(port)
        except OSError:
            s.close()
print("squatted", len(ports), flush=True)
time.sleep(30)
"""

# Rank 0 of a gang: binds its MASTER_PORT as torch's TCPStore does.
RANK0 = """
import os, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["MASTER_PORT"]))); s.listen()
print("rank 0 listens on", os.environ["MASTER_PORT"])
"""


@pytest.fixture
def ports():
    low = random.randrange(20_000, 27_000, 50)  # below the ephemeral range: nothing else takes them
    return low, low + 49


def meet(port: int) -> dict:
    return {"master_addr": "127.0.0.1", "master_port": port, "hosts": ["127.0.0.1"], "world_size": 1}


def test_a_job_that_binds_the_whole_range_leaves_another_gangs_port_alone(root_dir, reports, ports):
    low, high = ports
    runner = make_runner(root_dir, reports, uids=uid_pool(), rendezvous_ports=ports)
    if runner.cgroups is None:
        pytest.skip("no cgroup v2 on this host")
    try:
        squatter = [job_python(), "-c", SQUAT, str(low), str(high)]
        runner.start(attempt_id=1, number=1, job_id=7, command=squatter, rendezvous=meet(low + 1))
        out = wait_until(lambda: "squatted" in reports.log_of(1) and reports.log_of(1), runner=runner)
        assert "squatted 1" in out, out  # its own port only
        runner.start(
            attempt_id=2, number=1, job_id=8, command=[job_python(), "-c", RANK0], rendezvous=meet(low + 7)
        )
        end = wait_until(lambda: reports.finished(2), runner=runner)
        assert end["exit_code"] == 0 and f"rank 0 listens on {low + 7}" in reports.log_of(2), reports.log_of(
            2
        )
    finally:
        runner.shutdown(grace_s=0)


def test_a_rank_0_port_that_something_else_holds_is_refused_without_a_strike(
    root_dir, reports, ports, monkeypatch
):
    """A host where the bind rule cannot be loaded (or the port's holder is no job): rank 0's agent sees
    its port taken, and the job is re-queued (on another port), not counted."""
    monkeypatch.setattr(runner_module, "restrict_ports", lambda *a: False)
    low, _ = ports
    runner = make_runner(root_dir, reports, uids=uid_pool(), rendezvous_ports=ports)
    holder = socket.socket()
    holder.bind(("127.0.0.1", low + 9))
    holder.listen()
    try:
        command = [job_python(), "-c", RANK0]
        assert (
            runner.start(attempt_id=1, number=1, job_id=7, command=command, rendezvous=meet(low + 9))
            == "refused"
        )
        end = reports.finished(1)
        assert end["how"] == "refused" and f"the rendezvous port {low + 9} of n1 is taken" in end["detail"], (
            end
        )
        # Another rank than 0 does not bind the port: not checked.
        assert (
            runner.start(attempt_id=2, number=1, job_id=8, command=["true"], rank=1, rendezvous=meet(low + 9))
            == "started"
        )
    finally:
        holder.close()
        runner.shutdown(grace_s=0)
