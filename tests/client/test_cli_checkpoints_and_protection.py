"""`gpuquota checkpoint` inside a job (the marker the agent watches for, no login), `gpuquota min-runtime`
(a share's protection window, checked before anything is sent) and the PROTECTED column of `shares`."""

import io
import os

import pytest

from gpunodes.agent import checkpoints
from jobs.models import Attempt
from jobs.tasks import attempt_finished
from quotas.models import Share
from tests.api.conftest import run, submit
from tests.api.test_job_checkpoints import make_story


@pytest.fixture
def cli(capsys, monkeypatch):
    from gpuquota_client.cli import main

    def call(*argv):
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse refused the command line
            code = e.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


def login(cli, url, user, password, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    from gpuquota_client.cli import main

    assert main(["login", url, "-u", user, "--password-stdin"]) == 0


# --- gpuquota checkpoint ------------------------------------------------------------------------------


def test_checkpoint_writes_the_marker_the_agent_watches_for(cli, tmp_path, monkeypatch, config_file):
    from gpuquota_client.cli import CHECKPOINT_MARKER

    assert CHECKPOINT_MARKER == checkpoints.MARKER  # one name, on both sides
    monkeypatch.setenv("GPUQUOTA_CHECKPOINT_DIR", str(tmp_path))
    watch = checkpoints.Watch(tmp_path, started=0.0, known=checkpoints.scan(tmp_path))
    code, out, err = cli("checkpoint")
    assert code == 0 and "Checkpoint noted" in out, err
    marker = tmp_path / CHECKPOINT_MARKER
    at = marker.stat().st_mtime
    assert watch.look(now=at + 0.01, settle_s=60) == pytest.approx(at)  # counted at once, not settled
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_MARKER]  # no temporary file left


def test_checkpoint_outside_a_job_exits_2(cli, tmp_path, monkeypatch, config_file):
    monkeypatch.delenv("GPUQUOTA_CHECKPOINT_DIR", raising=False)
    code, _, err = cli("checkpoint")
    assert code == 2 and "not inside a gpuquota job" in err
    code, _, err = cli("checkpoint", "--dir", tmp_path / "nope")
    assert code == 2 and "no such directory" in err


def test_checkpoint_in_a_directory_it_cannot_write_exits_2(cli, tmp_path, monkeypatch, config_file):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    tmp_path.chmod(0o500)
    try:
        code, _, err = cli("checkpoint", "--dir", tmp_path)
    finally:
        tmp_path.chmod(0o700)
    assert code == 2 and "cannot write the checkpoint marker" in err


# --- gpuquota min-runtime and shares ------------------------------------------------------------------


def test_an_admin_sets_a_protection_window_and_shares_shows_it(
    cli, live_server, alice, vision_share, nodes, config_file, monkeypatch
):
    login(cli, live_server.url, "alice", "alice-pw-123", monkeypatch)
    code, out, err = cli("min-runtime", "vision-main", "10m")
    assert code == 0, err
    assert "at least 10m after a start" in out
    assert Share.objects.get(name="vision-main").min_runtime_s == 600
    code, out, _ = cli("shares")
    header, row = out.splitlines()[:2]
    assert "PROTECTED" in header and "10m" in row
    code, out, _ = cli("min-runtime", "vision-main", "0")
    assert code == 0 and "not protected" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["vision-main", "2d"], "DURATION: min_runtime_s is 0 to 86,400 seconds"),
        (["vision-main", "soon"], "is not a duration"),
        (["Vision Main", "10m"], "is not a share name"),
    ],
)
def test_a_bad_window_exits_2_before_anything_is_sent(
    cli, live_server, alice, vision_share, nodes, config_file, monkeypatch, argv, words
):
    login(cli, live_server.url, "alice", "alice-pw-123", monkeypatch)
    monkeypatch.setattr("gpuquota_client.client.Client.set_share", lambda *a, **k: pytest.fail("sent"))
    code, _, err = cli("min-runtime", *argv)
    assert code == 2 and words in err
    assert Share.objects.get(name="vision-main").min_runtime_s == 0


def test_a_window_the_server_refuses_exits_2_with_its_words(
    cli, live_server, bob, vision_share, nodes, config_file, monkeypatch
):
    login(cli, live_server.url, "bob", "bob-pw-123", monkeypatch)
    code, _, err = cli("min-runtime", "vision-main", "10m")
    assert code == 2 and "Only an admin may change this." in err
    assert Share.objects.get(name="vision-main").min_runtime_s == 0


def test_a_window_over_a_limit_lowered_since_the_login_exits_2_with_the_servers_words(
    cli, live_server, alice, vision_share, nodes, config_file, monkeypatch, settings
):
    login(cli, live_server.url, "alice", "alice-pw-123", monkeypatch)
    settings.MAX_MIN_RUNTIME_S = 300  # the client still holds the limit it was told at login
    code, _, err = cli("min-runtime", "vision-main", "10m")
    assert code == 2 and "min_runtime_s is 0 to 300 seconds" in err
    assert Share.objects.get(name="vision-main").min_runtime_s == 0


# --- gpuquota status: the last checkpoint and the work each attempt lost --------------------------------


def test_gpuquota_status_shows_them(bob, vision_share, nodes, live_server, config_file, capsys, monkeypatch):
    from gpuquota_client.cli import main

    story = make_story(bob, vision_share, nodes)
    monkeypatch.setattr("sys.stdin", io.StringIO("bob-pw-123\n"))
    assert main(["login", live_server.url, "-u", "bob", "--password-stdin"]) == 0
    capsys.readouterr()
    assert main(["status", str(story.pk)]) == 0
    out = capsys.readouterr().out
    assert "last checkpoint: " in out and "(4m ago)" in out
    assert "2 GPUs x 4m (reclaim)" in out and "WORK LOST" in out


def test_an_attempt_that_lost_nothing_says_none_in_status(
    bob, vision_share, nodes, live_server, config_file, capsys, monkeypatch
):
    from gpuquota_client.cli import main

    job = submit(bob, vision_share, gpus=1)
    a = run(job, nodes[0], [0])
    attempt_finished(a.pk, 1, "node-1", "exited", 0)
    monkeypatch.setattr("sys.stdin", io.StringIO("bob-pw-123\n"))
    main(["login", live_server.url, "-u", "bob", "--password-stdin"])
    capsys.readouterr()
    main(["status", str(job.pk)])
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("1 ")][0]
    assert row.rstrip().endswith("none")
    assert Attempt.objects.get(pk=a.pk).gpu_seconds_lost == 0
