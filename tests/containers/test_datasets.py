"""A container job's datasets: an allowed host directory is mounted read-only, nosuid and nodev; the job
reads it and cannot write it; a path that leads out of the directory that allowed it (a symlink, `..`)
or into the agent's own directories is refused before anything runs, in words."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from gpunodes.agent import containers
from tests.containers.conftest import needs_podman
from tests.security.agent_helpers import wait_until

pytestmark = needs_podman


@pytest.fixture
def host_dirs():
    """/var/tmp/<d>/allowed/imagenet/train.txt (a dataset), /var/tmp/<d>/outside/secret.txt (not one),
    and links from the allowed directory to the outside one, all readable by anyone (as datasets are)."""
    base = Path(tempfile.mkdtemp(prefix="gpuquota-datasets-", dir="/var/tmp"))
    base.chmod(0o755)
    allowed, outside = base / "allowed", base / "outside"
    (allowed / "imagenet").mkdir(parents=True)
    outside.mkdir()
    (allowed / "imagenet" / "train.txt").write_text("pixels\n")
    (outside / "secret.txt").write_text("outside-secret\n")
    (allowed / "escape").symlink_to(outside)  # a link to a directory outside
    (allowed / "imagenet" / "link").symlink_to(outside)  # a link inside a dataset
    for path in (base, allowed, outside, allowed / "imagenet"):
        path.chmod(0o755)
    for path in (allowed / "imagenet" / "train.txt", outside / "secret.txt"):
        path.chmod(0o644)
    yield allowed, outside
    shutil.rmtree(base, ignore_errors=True)


def start(runner, image, script, mounts, attempt_id=1):
    return runner.start(
        attempt_id=attempt_id,
        number=1,
        job_id=7,
        command=[script],
        use_shell=True,
        image=image,
        mounts=mounts,
    )


def test_a_container_job_reads_its_dataset_and_cannot_write_it(runner, reports, image, host_dirs):
    allowed, outside = host_dirs
    mounts = [{"host": str(allowed / "imagenet"), "container": "/data", "allowed_by": str(allowed)}]
    script = (
        "cat /data/train.txt; "
        "echo x > /data/new 2>/dev/null && echo WROTE-NEW || echo no-new; "
        "echo x >> /data/train.txt 2>/dev/null && echo WROTE-OLD || echo no-change; "
        "cat /data/link/secret.txt 2>/dev/null || echo link-goes-nowhere; "
        "grep ' /data ' /proc/mounts"
    )
    assert start(runner, image, script, mounts) == "started"
    done = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the dataset job")
    out = reports.log_of(1)
    assert done["how"] == "exited" and done["exit_code"] == 0, out
    for word in ("pixels", "no-new", "no-change", "link-goes-nowhere"):
        assert word in out, out
    assert "WROTE" not in out and "outside-secret" not in out, out
    options = next(line for line in out.splitlines() if " /data " in line).split()[3].split(",")
    assert {"ro", "nosuid", "nodev"} <= set(options), options
    assert (allowed / "imagenet" / "train.txt").read_text() == "pixels\n"
    assert not (allowed / "imagenet" / "new").exists()


@pytest.mark.parametrize(
    "host, words",
    [
        ("{allowed}/escape", "(a symlink), outside"),  # a link out of the allowed directory
        ("{allowed}/../outside", "is not a plain absolute path"),
        ("{outside}", "is not under"),
    ],
)
def test_a_dataset_that_leads_outside_what_allowed_it_is_refused(
    runner, reports, image, host_dirs, host, words
):
    allowed, outside = host_dirs
    mounts = [
        {
            "host": host.format(allowed=allowed, outside=outside),
            "container": "/data",
            "allowed_by": str(allowed),
        }
    ]
    assert start(runner, image, "cat /data/secret.txt", mounts) == "failed"
    done = reports.finished(1)
    assert done["how"] == "failed_to_start" and words in done["detail"], done
    assert "outside-secret" not in reports.log_of(1)


def test_the_agents_own_directories_are_never_a_dataset(runner, reports, image, host_dirs):
    state = runner.state_path.parent
    mounts = [{"host": str(state), "container": "/data", "allowed_by": str(state.parent)}]
    assert start(runner, image, "ls /data", mounts) == "failed"
    assert "the agent's own" in reports.finished(1)["detail"]


def test_resolve_dataset_checks_the_container_path_too(host_dirs):
    allowed, _ = host_dirs
    for target in ("/", "/etc", "/proc/x", "data", "/a/../etc"):
        with pytest.raises(containers.ContainerError):
            containers.resolve_dataset(str(allowed / "imagenet"), target, str(allowed))
    assert containers.resolve_dataset(str(allowed / "imagenet"), "/data", str(allowed)) == (
        os.path.realpath(allowed / "imagenet"),
        "/data",
    )
