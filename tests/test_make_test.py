"""`make test` runs the in-process tests on two workers, then the `serial` ones one at a time (README,
"Tests"): every test in exactly one part, each worker with its own Redis database."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config.settings import xdist_redis_url

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_test_runs_the_in_process_part_on_workers_then_the_serial_part():
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "test"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert '-m "not serial" -n 2' in dry and "-m serial" in dry
    assert dry.index("not serial") < dry.index("-m serial ")
    one = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "test", "PYTEST_ARGS=tests/quotas -k victims"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    assert "pytest tests/quotas -k victims" in one and "serial" not in one


def test_real_processes_and_the_browser_are_serial_and_the_policy_is_not():
    files = [
        "tests/live/test_cluster.py",
        "tests/browser/test_dashboard.py",
        "tests/security/test_attempt_limits.py",
        "tests/quotas/test_policy.py",
        "tests/security/test_permission_matrix.py",
    ]
    parts = {}
    for mark in ("serial", "not serial"):
        listed = subprocess.run(
            [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", mark, *files],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout
        parts[mark] = {line.split("::")[0] for line in listed.splitlines() if "::" in line}
    assert parts["serial"] == {
        "tests/live/test_cluster.py",
        "tests/browser/test_dashboard.py",
        "tests/security/test_attempt_limits.py",
    }
    assert parts["not serial"] == {"tests/quotas/test_policy.py", "tests/security/test_permission_matrix.py"}


def test_every_in_process_file_of_a_serial_directory_exists():
    from tests.conftest import IN_PROCESS_FILES, SERIAL_DIRS, TESTS

    for name in IN_PROCESS_FILES:
        assert (TESTS / name).is_file(), name
        assert name.split("/")[0] in SERIAL_DIRS, name


@pytest.mark.parametrize(
    ("url", "worker", "expected"),
    [
        ("redis://127.0.0.1:6379/15", "gw0", "redis://127.0.0.1:6379/15"),
        ("redis://127.0.0.1:6379/15", "gw1", "redis://127.0.0.1:6379/14"),
        (
            "redis://:secret@redis.example:6380/0?ssl_cert_reqs=none",
            "gw1",
            "redis://:secret@redis.example:6380/15?ssl_cert_reqs=none",
        ),
        ("redis://127.0.0.1:6379", "gw2", "redis://127.0.0.1:6379/14"),
    ],
)
def test_each_worker_has_its_own_redis_database(url, worker, expected):
    assert xdist_redis_url(url, worker) == expected


def test_a_process_a_worker_starts_gets_the_workers_files_and_redis_database_not_them_applied_twice(tmp_path):
    show = "import config.settings as s; print(s.VAR_DIR, s.REDIS_URL)"
    child = f"{show}; import subprocess, sys; print(subprocess.run([sys.executable, '-c', {show!r}], capture_output=True, text=True).stdout, end='')"
    env = {
        **{k: v for k, v in os.environ.items() if k != "GPUQUOTA_XDIST_APPLIED"},
        "PYTEST_XDIST_WORKER": "gw1",
        "GPUQUOTA_VAR_DIR": str(tmp_path),
        "REDIS_URL": "redis://127.0.0.1:6379/15",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run(
        [sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    worker, grandchild = out.stdout.splitlines()
    assert worker == f"{tmp_path / 'gw1'} redis://127.0.0.1:6379/14", out.stderr
    assert grandchild == worker
