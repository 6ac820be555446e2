"""`gpuquota shares export|plan|apply|history` against a live server: the layout as one file, a plan
with its effect, apply, versions; bad input is exit code 2 with every problem under its path."""

import pytest
import yaml

from quotas.models import LayoutVersion, Share
from tests.api.conftest import submit


def log_in(cli, url, user, password):
    code, _, err = cli("login", url, "--username", user, "--password-stdin", stdin=password + "\n")
    assert code == 0, err


@pytest.fixture
def as_admin(cli, live_server, alice, bob, vision_share, language_share, nodes, config_file):
    log_in(cli, live_server.url, "alice", "alice-pw-123")
    return cli


def without_comments(text):
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_export_writes_the_layout_as_yaml(as_admin, tmp_path):
    code, out, err = as_admin("shares", "export")
    assert code == 0, err
    data = yaml.safe_load(out)
    assert [s["name"] for s in data["shares"]] == ["language-main", "vision-main"]
    path = tmp_path / "layout.yaml"
    code, _, err = as_admin("shares", "export", "-o", path)
    assert code == 0 and f"Wrote the layout to {path}" in err
    assert without_comments(path.read_text()) == without_comments(out)
    code, out, _ = as_admin("--json", "shares", "export")
    assert code == 0 and yaml.safe_load(out) == data  # JSON is YAML


def test_export_plan_of_the_same_file_shows_no_change(as_admin, tmp_path):
    path = tmp_path / "layout.yaml"
    as_admin("shares", "export", "-o", path)
    code, out, err = as_admin("shares", "plan", "-f", path, "--no-whatif")
    assert code == 0, err
    assert ": no change" in out.splitlines()[0] and "Nothing to apply: this is the layout as it is." in out


def test_export_edit_plan_apply_export_gives_the_edited_file(as_admin, tmp_path):
    path = tmp_path / "layout.yaml"
    as_admin("shares", "export", "-o", path)
    edited = path.read_text().replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    path.write_text(edited + "# a comment of my own\n")
    code, out, err = as_admin("shares", "plan", "-f", path, "--no-whatif")
    assert code == 0, err
    assert "  share vision-main changed: capacity.a10g 4 → 3" in out
    assert "Now:\n  nothing running or queued is affected" in out
    plan_id = out.strip().splitlines()[-1].split()[-1]
    assert out.strip().endswith(f"Apply it: gpuquota shares apply {plan_id}")
    code, out, err = as_admin("shares", "apply", plan_id)
    assert (code, out.strip()) == (0, "Applied as version 1: 1 share: 1 changed (vision-main)."), err
    code, out, _ = as_admin("shares", "export")
    assert without_comments(out) == without_comments(edited)
    # The same plan again: refused, exit 2, in words.
    code, _, err = as_admin("shares", "apply", plan_id)
    assert code == 2 and err.strip() == "gpuquota: This plan was applied already (version 1)."


def test_a_plan_that_over_commits_is_applied_only_with_overcommit(as_admin, tmp_path):
    path = tmp_path / "layout.yaml"
    as_admin("shares", "export", "-o", path)
    path.write_text(path.read_text().replace("capacity: {a10g: 4}", "capacity: {a10g: 10}"))
    code, out, err = as_admin("shares", "plan", "-f", path, "--no-whatif")
    assert code == 0 and "over-committed: a10g: the shares would hold 12 GPUs (now 6), 8 are READY" in out, (
        err
    )
    plan_id = out.strip().splitlines()[-1].split()[-1]
    code, _, err = as_admin("shares", "apply", plan_id)
    assert code == 2 and "this plan over-commits a10g" in err
    assert err.strip().endswith(f"(gpuquota shares apply {plan_id} --overcommit)")
    code, out, err = as_admin("shares", "apply", plan_id, "--overcommit")
    assert code == 0 and out.startswith("Applied as version 1"), err


def test_a_bad_layout_is_exit_2_with_every_problem_under_its_path(as_admin, tmp_path):
    path = tmp_path / "layout.yaml"
    as_admin("shares", "export", "-o", path)
    text = path.read_text().replace("capacity: {a10g: 4}", "capacity: {a10g: -4}")
    path.write_text(text.replace("strategy: LEND\n", "strategy: LEND\n    colour: red\n"))
    code, out, err = as_admin("shares", "plan", "-f", path)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "gpuquota: the layout was not planned: 2 problems",
        "  shares[0].colour: unknown field; known: name, team, description, capacity, strategy, borrow_limit, in_share_preemption, min_runtime_s, state, allowed_images, allowed_mounts, group, weight, previous_name, until",
        "  shares[1].capacity.a10g: must be a whole number of GPUs, 0 or more (got -4)",
    ]
    path.write_text("teams: [\n")
    code, _, err = as_admin("shares", "plan", "-f", path)
    assert code == 2 and "document: not valid YAML" in err and "(line 2, column 1)" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["shares", "plan", "-f", "/no/such/layout.yaml"], "-f /no/such/layout.yaml: no such file"),
        (["shares", "plan"], "plan: give the layout with -f FILE (- for stdin), or --rollback N"),
        (["shares", "plan", "-f", "-", "--rollback", "1"], "plan: give the layout with -f FILE"),
        (["shares", "plan", "--rollback", "7"], "rollback: no layout version 7 (none yet)"),
        (["shares", "apply", "not-a-plan"], "'not-a-plan' is not a plan id"),
        (["shares", "apply", "00000000-0000-0000-0000-000000000000"], "No such layout plan."),
    ],
)
def test_bad_input_is_exit_2_with_a_clear_message(as_admin, argv, message):
    code, _, err = as_admin(*argv)
    assert code == 2 and message in err, err


def test_a_plan_read_from_stdin(as_admin):
    code, out, _ = as_admin("shares", "export")
    code, out, err = as_admin(
        "shares", "plan", "-f", "-", "--no-whatif", stdin=out.replace("{a10g: 2}", "{a10g: 1}")
    )
    assert code == 0 and "share language-main changed: capacity.a10g 2 → 1" in out, err


def test_a_plan_prints_last_week_replayed_with_it(celery_eager, as_admin, bob, vision_share):
    for _ in range(3):
        submit(bob, vision_share, gpus=4, max_runtime_s=600)
    code, out, _ = as_admin("shares", "export")
    edited = out.replace("capacity: {a10g: 4}", "capacity: {a10g: 1}\n    strategy: RESERVE").replace(
        "    strategy: LEND_AND_BORROW\n", ""
    )
    code, out, err = as_admin("shares", "plan", "-f", "-", stdin=edited)
    assert code == 0, err
    assert "What if: last week replayed as is and with the plan (3 submissions from " in out
    assert "  SHARE" in out and "  vision-main *" in out
    assert "  utilisation over the replayed window (%): " in out


def test_history_and_rollback(as_admin, tmp_path):
    path = tmp_path / "layout.yaml"
    as_admin("shares", "export", "-o", path)
    original = path.read_text()
    path.write_text(original.replace("capacity: {a10g: 4}", "capacity: {a10g: 6}\n    until: 2d"))
    code, out, _ = as_admin("shares", "plan", "-f", path, "--no-whatif")
    assert "Temporary: vision-main until " in out and ": capacity.a10g back to 4" in out
    as_admin("shares", "apply", out.strip().split()[-1])
    code, out, err = as_admin("shares", "history")
    assert code == 0, err
    assert "1        " in out and "alice" in out and "1 share: 1 changed (vision-main)" in out
    assert "TEMPORARY" in out and "capacity.a10g back to 4" in out
    code, out, _ = as_admin("shares", "plan", "--rollback", "1", "--no-whatif")
    assert "a rollback to version 1: no change" in out
    assert LayoutVersion.objects.count() == 1 and Share.objects.get(name="vision-main").capacity_map() == {
        "a10g": 6
    }
    code, out, _ = as_admin("shares", "plan", "--rollback", "0", "--no-whatif")
    assert code == 0 and "a rollback to the layout before version 1: 1 share: 1 changed (vision-main)" in out
    assert "capacity.a10g 6 → 4" in out


def test_a_member_may_not_read_the_layout_a_manager_reads_its_teams_part(
    cli, live_server, bob, dave_manager, vision_share, language_share, config_file
):
    log_in(cli, live_server.url, "bob", "bob-pw-123")
    code, _, err = cli("shares", "export")
    assert code == 2 and "Only admins and team managers read the layout" in err
    code, _, err = cli("shares", "plan", "--rollback", "1")
    assert code == 2 and "Only an admin may do this." in err
    log_in(cli, live_server.url, "dave", "dave-pw-123")
    code, out, _ = cli("shares", "export")
    assert code == 0 and "team_part: [vision]" in out
    assert [s["name"] for s in yaml.safe_load(out)["shares"]] == ["vision-main"]


@pytest.fixture
def dave_manager(django_user_model, vision):
    from quotas.choices import Role
    from quotas.models import Membership

    user = django_user_model.objects.create_user("dave", "dave@example.com", "dave-pw-123")
    Membership.objects.create(team=vision, user=user, role=Role.MANAGER)
    return user
