"""The start-up check of the fencing margin (gpunodes/checks.py): an agent's lease lapses, and its jobs
are stopped, before its node can be declared LOST."""

from gpunodes.checks import fence_before_lost


def ids(settings) -> list[str]:
    return [m.id for m in fence_before_lost(None)]


def test_the_defaults_pass(settings):
    settings.NODE_LOST_AFTER_S, settings.FENCE_AFTER_S, settings.FENCE_GRACE_S = 180, 120, 30
    settings.HEARTBEAT_INTERVAL_S = 5
    assert ids(settings) == []


def test_a_fence_that_could_come_after_the_loss_is_an_error(settings):
    settings.NODE_LOST_AFTER_S, settings.FENCE_AFTER_S, settings.FENCE_GRACE_S = 180, 150, 30
    settings.HEARTBEAT_INTERVAL_S = 5
    assert ids(settings) == ["gpunodes.E001"]  # 150 + 30 + 2 heartbeats > 180


def test_a_lease_shorter_than_two_heartbeats_is_an_error(settings):
    settings.NODE_LOST_AFTER_S, settings.FENCE_AFTER_S, settings.FENCE_GRACE_S = 180, 8, 30
    settings.HEARTBEAT_INTERVAL_S = 5
    assert ids(settings) == ["gpunodes.E002"]


def test_no_lease_is_a_warning(settings):
    settings.NODE_LOST_AFTER_S, settings.FENCE_AFTER_S = 4, 0
    assert ids(settings) == ["gpunodes.W001"]


def test_the_agent_refuses_to_start_with_a_bad_margin(settings, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "NODE_LOST_AFTER_S": "30", "FENCE_AFTER_S": "29", "GPUQUOTA_VAR_DIR": str(tmp_path)}
    env.pop("REDIS_URL", None)
    r = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0 and "gpunodes.E001" in r.stderr
