"""The organisation page (issue 37, item 3): the tree per GPU type with each group's and share's
capacity, use, taken from and lent outside, fair-share value and state in words; the reader's own shares
with their fair part and why they wait; live over htmx, one partial per swap target; a member sees
groups and shares by name, never another team's jobs."""

import re

import pytest

from tests import org_world
from tests.web.conftest import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(alice, bob, charlie, vision_share, language_share, nodes):
    return org_world.build(alice, bob, vision_share, language_share, nodes)


def row(html: str, name: str) -> str:
    match = re.search(rf'<tr data-name="{name}".*?</tr>', html, re.S)
    assert match, f"no row for {name}"
    return match.group(0)


def cells(tr: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]


def test_the_page_shows_each_node_with_its_numbers_and_state(as_bob, world):
    r = as_bob.get("/organisation/")
    assert r.status_code == 200
    html = r.content.decode()
    research = cells(row(html, "research"))
    # name, state, capacity, in use, taken from outside, lent outside, weight, history, value, limits
    assert research[1:7] == ["starved", "4", "6", "2", "0", "1"]
    assert "may take 2 from outside" in research[9]
    vision = cells(row(html, "vision-main"))
    assert vision[1:5] == ["starved", "4", "6", "2"] and vision[6] == "2"
    # its fair part as rule 5 splits: by weight x capacity among the borrowers that wait (it is alone)
    assert vision[9] == "fair part 4 (weight 2 × 4 a10g of capacity = 8 of 8)", vision[9]
    assert cells(row(html, "lang"))[1] == "lending"
    # the value with its parts: (2 taken + 0 history) / (weight 1 x 4 capacity)
    assert 'title="(2 taken + 0.0 history) ÷ (weight 1 × 4 capacity) = 0.50"' in row(html, "research")
    assert 'data-plot="sunburst"' in html  # groups: the tree drawn too
    assert 'aria-current="page"' in html.split("Organisation</a>")[0].rsplit("<a", 1)[1]


def test_the_readers_share_says_its_fair_part_and_why_it_waits(as_bob, world):
    html = as_bob.get("/organisation/").content.decode()
    mine = html.split('id="org-mine"')[1].split("</section>")[0]
    assert "your fair part of idle a10g now is" in mine
    assert "weight 2 × 4 a10g of capacity = 8 of 8 among the borrowers that wait" in mine
    assert "group research may take 2 a10g from outside: 2 taken" in mine


def test_a_member_sees_groups_and_shares_by_name_never_another_teams_jobs(as_charlie, world):
    html = as_charlie.get("/organisation/").content.decode()
    assert 'data-name="vision-main"' in html and 'data-name="research"' in html
    for job in world.values():
        assert job.name not in html
        assert f"/jobs/{job.pk}/" not in html
    mine = html.split('id="org-mine"')[1].split("</section>")[0]
    assert "vision-main" not in mine and "language-main" in mine


@pytest.mark.parametrize("part, target", [("tree", 'id="org-tree"'), ("mine", 'id="org-mine"')])
def test_each_live_part_is_its_own_partial(as_bob, world, part, target):
    r = hx(as_bob, f"/organisation/?part={part}")
    html = r.content.decode()
    assert r.status_code == 200 and html.lstrip().startswith("<section") and target in html
    assert "<html" not in html and 'hx-trigger="every 5s"' in html


def test_a_flat_layout_has_no_tree_to_draw_and_reads_as_shares(as_bob, bob, vision_share, nodes):
    html = as_bob.get("/organisation/").content.decode()
    assert 'data-plot="sunburst"' not in html and "plotly" not in html
    assert cells(row(html, "vision-main"))[1] == "within its guarantee"


def test_anonymous_is_sent_to_log_in(client, world):
    assert client.get("/organisation/").status_code == 302


# --- the tree edited on the layout page (admins) -----------------------------------------------------


def layout_text(client) -> str:
    import html as html_lib

    body = client.get("/layout/").content.decode()
    start = body.index('data-testid="layout-document">') + len('data-testid="layout-document">')
    return html_lib.unescape(body[start : body.index("</textarea>", start)])


def test_the_layout_page_holds_the_tree_and_plans_a_limit_with_what_it_leaves_uncovered(as_alice, world):
    text = layout_text(as_alice)
    assert "groups:\n  - {name: lang}\n  - {name: research, borrow_limit: 50}\n" in text
    assert "    group: research\n    weight: 2\n" in text
    edited = text.replace("{name: research, borrow_limit: 50}", "{name: research, borrow_limit: 0}")
    r = as_alice.post("/layout/plan/", {"document": edited, "whatif": "0"}, HTTP_HX_REQUEST="true")
    body = r.content.decode()
    assert r.status_code == 200, body
    assert "1 group: 1 changed (research)" in body
    assert (
        'data-testid="uncovered"' in body and "group research may take 0 a10g from outside: 2 taken" in body
    )


def test_a_cycle_on_the_layout_page_is_a_form_error_under_its_path(as_alice, world):
    edited = layout_text(as_alice).replace("{name: lang}", "{name: lang, parent: lang}")
    r = as_alice.post("/layout/plan/", {"document": edited}, HTTP_HX_REQUEST="true")
    body = r.content.decode()
    assert r.status_code == 400 and "<code>groups[0].parent</code>: a cycle: lang -&gt; lang" in body


def test_the_django_admin_lists_the_groups_read_only(as_alice, world):
    r = as_alice.get("/admin/quotas/group/")
    assert r.status_code == 200 and "research" in r.content.decode()
    assert as_alice.get("/admin/quotas/group/add/").status_code == 403


def test_the_team_page_says_each_shares_fair_part_and_why_it_waits(as_bob, world):
    html = as_bob.get("/teams/vision/").content.decode()
    fair = html.split('data-testid="team-fair"')[1].split("</section>")[0]
    assert (
        "your fair part of idle a10g now is" in fair
        and "weight 2 × 4 a10g of capacity = 8 of 8 among the borrowers that wait" in fair
    )
    assert "group research may take 2 a10g from outside: 2 taken" in fair


@pytest.mark.parametrize("url", ["/organisation/", "/organisation/?part=tree", "/organisation/?part=mine"])
def test_the_page_and_its_parts_run_constant_queries(
    as_bob, bob, vision_share, world, nodes, constant_queries, url
):
    from tests.api.conftest import run, submit

    def grow():
        for _ in range(30):
            submit(bob, vision_share, gpus=2)
        run(submit(bob, vision_share), nodes[1], [2])

    constant_queries(as_bob, url, grow, HTTP_HX_REQUEST="true")


def test_a_group_added_with_its_defaults_has_its_rows_in_the_plans_table(as_alice, world):
    edited = layout_text(as_alice).replace("  - {name: lang}\n", "  - {name: audio}\n  - {name: lang}\n")
    r = as_alice.post("/layout/plan/", {"document": edited, "whatif": "0"}, HTTP_HX_REQUEST="true")
    body = r.content.decode()
    assert r.status_code == 200, body
    table = body.split('data-testid="layout-diff"')[1].split("</table>")[0]
    assert "group <b>audio</b>" in table and "<code>lend_limit</code>" in table
