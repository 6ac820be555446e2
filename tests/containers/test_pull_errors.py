"""A failed pull's reason, as the job's owner reads it: the registry's words, without podman's layers of
prefixes and repeats (no podman needed)."""

import pytest

from gpunodes.agent.containers import cgroup_parent, pull_error


@pytest.mark.parametrize(
    ("output", "said"),
    [
        (
            "Error: initializing source docker://reg:5000/a/b:1: reading manifest 1 in reg:5000/a/b: "
            "manifest unknown: manifest unknown",
            "reading manifest 1 in reg:5000/a/b: manifest unknown",
        ),
        (
            'Error: initializing source docker://reg:1/a:1: pinging container registry reg:1: Get "https://reg:1/v2/": '
            "dial tcp 10.0.0.1:1: connect: connection refused",
            'pinging container registry reg:1: Get "https://reg:1/v2/": dial tcp 10.0.0.1:1: connect: connection refused',
        ),
        ("Error: unauthorized: authentication required", "unauthorized: authentication required"),
    ],
)
def test_a_pull_error_is_the_registrys_reason(output, said):
    assert pull_error(["Trying to pull ...", output]) == said


def test_the_container_cgroup_goes_under_the_attempts_in_every_hierarchy():
    v1 = [f"/sys/fs/cgroup/{c}/gpuquota-n1-9/attempt-1-1" for c in ("memory", "pids", "cpu")]
    assert cgroup_parent(v1) == "/gpuquota-n1-9/attempt-1-1"
    # Different places in different hierarchies: no one parent (the limits are set on the container).
    assert cgroup_parent([*v1, "/sys/fs/cgroup/devices/elsewhere/attempt-1-1"]) is None
