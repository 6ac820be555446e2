"""The programs the live and fault tests' jobs run are readable by any uid, wherever the checkout sits:
a root agent runs each attempt as a uid of its own, which could not read examples/train.py in a clone
under a 0700 directory (`mktemp -d`), and the jobs timed out saying nothing more (issue 32)."""

import os
import subprocess

import pytest

from tests.live.conftest import EXAMPLES
from tests.security.agent_helpers import job_python

pytestmark = [
    pytest.mark.live,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0, reason="reading as another uid needs root"),
]

NOBODY = 65534


def as_nobody(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    def drop() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.run(argv, preexec_fn=drop, capture_output=True, text=True, timeout=60, cwd="/", env=env)


def test_a_job_uid_can_read_every_example_program(cluster):
    names = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix == ".py")
    assert "train.py" in names
    for name in names:
        path = cluster.program(name)
        assert not path.startswith(str(EXAMPLES.parent)), path  # not in the checkout
        done = as_nobody(job_python(), "-c", f"open({path!r}).read()")
        assert done.returncode == 0, done.stderr


def test_train_runs_as_a_job_uid(cluster):
    checkpoints = cluster.jobs / "checkpoints-nobody"
    checkpoints.mkdir()
    checkpoints.chmod(0o777)
    done = as_nobody(
        job_python(),
        cluster.program("train.py"),
        "--steps",
        "2",
        "--step-seconds",
        "0",
        env={"PATH": "/usr/bin:/bin", "GPUQUOTA_CHECKPOINT_DIR": str(checkpoints)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
