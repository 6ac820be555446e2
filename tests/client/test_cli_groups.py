"""`gpuquota groups` (issue 37, item 3): the organisation tree with each group's and share's numbers,
fair-share value and state; --gpu-type; --json; and a bad tree planned from a file is exit 2 with the
problem under its path."""

import json

import pytest

from tests import org_world


@pytest.fixture
def world(alice, bob, charlie, vision_share, language_share, nodes):
    return org_world.build(alice, bob, vision_share, language_share, nodes)


def login(cli, live_server, user="bob", password="bob-pw-123"):
    code, _, err = cli("login", live_server.url, "-u", user, "--password-stdin", stdin=password + "\n")
    assert code == 0, err


def test_groups_prints_the_tree_with_values_and_states(cli, live_server, world, config_file):
    login(cli, live_server)
    code, out, err = cli("groups")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "GROUP/SHARE",
        "TYPE",
        "CAPACITY",
        "IN",
        "USE",
        "TAKEN",
        "LENT",
        "WEIGHT",
        "HISTORY",
        "VALUE",
        "STATE",
    ]
    names = [line.split()[0] for line in lines[1:5]]
    assert names == ["lang/", "language-main", "research/", "vision-main"]
    research = lines[3].split()
    assert research[:9] == ["research/", "a10g", "4", "6", "2", "0", "1", "0.0", "0.50"]
    assert research[9] == "starved"
    assert lines[4].startswith("  vision-main ")  # indented under its group
    assert lines[4].split()[6] == "2"  # its weight
    assert "the lowest borrows first" in out


def test_groups_json_and_a_type_with_nothing(cli, live_server, world, config_file):
    login(cli, live_server)
    code, out, _ = cli("--json", "groups")
    body = json.loads(out)
    assert [g["name"] for g in body["groups"]] == ["lang", "research"]
    assert next(s for s in body["shares"] if s["name"] == "vision-main")["group"] == "research"
    code, out, _ = cli("groups", "--gpu-type", "h100")
    assert code == 0 and out.startswith("No group or share has capacity, use or a waiting job of h100.")


def test_a_cycle_planned_from_a_file_is_exit_2_under_its_path(cli, live_server, world, config_file, tmp_path):
    login(cli, live_server, "alice", "alice-pw-123")
    code, text, err = cli("shares", "export")
    assert code == 0, err
    bad = text.replace("{name: lang}", "{name: lang, parent: research}").replace(
        "{name: research, borrow_limit: 50}", "{name: research, parent: lang, borrow_limit: 50}"
    )
    path = tmp_path / "layout.yaml"
    path.write_text(bad)
    code, _, err = cli("shares", "plan", "-f", path)
    assert code == 2
    assert "groups[0].parent: a cycle: lang -> research -> lang" in err


def test_a_plan_of_a_lower_group_limit_says_what_it_leaves_uncovered(
    cli, live_server, world, config_file, tmp_path
):
    login(cli, live_server, "alice", "alice-pw-123")
    code, text, err = cli("shares", "export")
    path = tmp_path / "layout.yaml"
    path.write_text(text.replace("{name: research, borrow_limit: 50}", "{name: research, borrow_limit: 0}"))
    code, out, err = cli("shares", "plan", "-f", path, "--no-whatif")
    assert code == 0, err
    assert "group research changed: borrow_limit 50 → 0" in out
    assert "  uncovered: group research may take 0 a10g from outside: 2 taken, 2 uncovered" in out
