"""`gpuquota advise` (issue 38): starts an advice run, waits, prints the frontier (today's point and the
recommended one marked, what changes for whom); --run reads one; --plan N makes a layout plan; a bad
--weeks is exit 2; a non-admin is refused (exit 2 with the server's words)."""

import io
import json

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


def login(cli, live_server, user, password):
    code, _, err = cli("login", live_server.url, "-u", user, "--password-stdin", stdin=password + "\n")
    assert code == 0, err


def test_advise_prints_the_frontier_and_plans_a_point(cli, live_server, alice, config_file, celery_eager):
    call_command("seed_history", jobs=60, stdout=io.StringIO())
    login(cli, live_server, "alice", "alice-pw-123")
    code, out, err = cli("advise", "--weeks", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert "replays of" in lines[0] and "Today: utilisation" in lines[0]
    assert lines[1].split()[:4] == ["POINT", "UTIL%", "OWNERS", "P95"]
    assert "today" in out and "recommended" in out.lower()
    run_id = lines[-1].split("--run ")[1].split()[0]
    code, out, err = cli("--json", "advise", "--run", run_id)
    assert code == 0, err
    data = json.loads(out)
    assert data["state"] == "done" and data["advice"]["replays"] > 1
    code, out, err = cli("advise", "--run", run_id, "--plan", 0)
    assert code == 0, err
    assert "Layout plan" in out and "gpuquota shares apply" in out
    code, out, err = cli("advise", "--run", run_id, "--plan", 99)
    assert code == 2 and "point" in err


def test_advise_refuses_bad_weeks_and_non_admins(cli, live_server, bob, config_file):
    login(cli, live_server, "bob", "bob-pw-123")
    with pytest.raises(SystemExit) as e:
        cli("advise", "--weeks", "9")
    assert e.value.code == 2
    code, out, err = cli("advise", "--weeks", "1")
    assert code == 2 and err.strip().endswith("Only an admin may do this.")
    code, out, err = cli("advise", "--plan", "1")
    assert code == 2 and "--run" in err
