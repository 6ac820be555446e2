"""The layout page (admins): the whole layout to edit, paste or upload; a plan with every problem beside
its path, the diff, what it does now and last week replayed with it; Apply; versions to roll back to;
temporary changes on the shares page with when they end."""

from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from quotas import layout
from quotas.models import Share
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


def current_yaml(client) -> str:
    body = client.get("/layout/").content.decode()
    start = body.index('data-testid="layout-document">') + len('data-testid="layout-document">')
    import html

    return html.unescape(body[start : body.index("</textarea>", start)])


def test_only_admins_change_the_layout(as_bob, vision_share):
    assert as_bob.get("/layout/").status_code == 403
    assert as_bob.post("/layout/plan/", {"document": "teams: []\nshares: []"}).status_code == 403


def test_the_page_holds_the_layout_to_edit_and_the_versions(as_alice, vision_share, language_share, nodes):
    text = current_yaml(as_alice)
    assert "  - name: vision-main\n    team: vision\n" in text and text.startswith("# Exported ")
    body = as_alice.get("/layout/").content.decode()
    assert "No layout applied through a plan yet." in body


def test_a_plan_shows_the_diff_then_apply_applies_it(as_alice, bob, vision_share, language_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    response = as_alice.post("/layout/plan/", {"document": edited, "whatif": "0"}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200, body
    assert "1 share: 1 changed (vision-main)" in body and 'data-testid="layout-diff"' in body
    assert "<td><code>capacity.a10g</code></td><td>4</td><td>3</td>" in body
    assert "Nothing running or queued is affected now." in body
    planned = layout.LayoutPlan.objects.get()
    response = as_alice.post(f"/layout/plans/{planned.pk}/apply/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Applied as version 1" in response.content.decode()
    assert Share.objects.get(name="vision-main").capacity_map() == {"a10g": 3}
    # Applied once; a second press is refused in words.
    again = as_alice.post(f"/layout/plans/{planned.pk}/apply/", HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and again.content.decode() == "This plan was applied already (version 1)."
    body = as_alice.get("/layout/").content.decode()
    assert "Plan a rollback to this" in body and "vision-main (changed)" in body


def test_every_problem_is_shown_with_its_path_and_nothing_is_planned(as_alice, vision_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: -4}")
    edited = edited.replace("strategy: LEND_AND_BORROW", "strategy: HOARD")
    response = as_alice.post("/layout/plan/", {"document": edited}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 400 and "Not planned: 2 problems." in body
    assert "<code>shares[0].capacity.a10g</code>: must be a whole number of GPUs, 0 or more (got -4)" in body
    assert "<code>shares[0].strategy</code>" in body
    assert not layout.LayoutPlan.objects.exists()


def test_an_uploaded_file_is_planned(as_alice, vision_share, nodes):
    text = current_yaml(as_alice).replace('description: ""', "description: uploaded")
    upload = SimpleUploadedFile("layout.yaml", text.encode(), content_type="application/yaml")
    response = as_alice.post("/layout/plan/", {"document": "ignored", "file": upload, "whatif": "0"})
    assert response.status_code == 200 and "description" in response.content.decode()
    [change] = layout.LayoutPlan.objects.get().diff
    assert change["fields"] == [{"field": "description", "before": "", "after": "uploaded"}]


def test_a_plan_made_stale_is_refused_in_words(as_alice, vision_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    as_alice.post("/layout/plan/", {"document": edited, "whatif": "0"})
    stale = layout.LayoutPlan.objects.get()
    layout.apply(plan_id=layout.plan(source=edited.replace("{a10g: 3}", "{a10g: 2}"), run_whatif=False).pk)
    response = as_alice.post(f"/layout/plans/{stale.pk}/apply/", HTTP_HX_REQUEST="true")
    assert (
        response.status_code == 409
        and "The layout changed since this plan was made" in response.content.decode()
    )


def test_a_rollback_is_planned_from_the_versions(as_alice, vision_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    layout.apply(plan_id=layout.plan(source=edited, run_whatif=False).pk)
    layout.apply(plan_id=layout.plan(source=edited.replace("{a10g: 3}", "{a10g: 1}"), run_whatif=False).pk)
    body = as_alice.post(
        "/layout/plan/", {"rollback": "1", "whatif": "0"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "(a rollback to version 1)" in body and "<td>1</td><td>3</td>" in body
    response = as_alice.post("/layout/plan/", {"rollback": "9"}, HTTP_HX_REQUEST="true")
    assert (
        response.status_code == 400 and "no layout version 9 (versions 1 to 2)" in response.content.decode()
    )


def test_the_plan_shows_the_whatif_of_last_week(
    celery_eager, as_alice, bob, vision_share, language_share, nodes
):
    for _ in range(3):
        submit(bob, vision_share, gpus=4, max_runtime_s=600)
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 1}\n    until: 2d")
    body = as_alice.post("/layout/plan/", {"document": edited}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-testid="whatif-shares"' in body and 'data-plot="whatif"' in body
    assert "Replayed 3 submissions" in body and "with the plan" in body
    assert 'data-testid="layout-temporary"' in body and "<code>capacity.a10g</code> goes back to 4" in body
    assert "Temporary changes go back during the replay" in body


def test_the_shares_page_shows_temporary_changes_and_when_they_end(as_alice, vision_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 6}\n    until: 3d")
    layout.apply(plan_id=layout.plan(source=edited, run_whatif=False).pk)
    body = as_alice.get("/shares/").content.decode()
    assert 'data-testid="temporary-changes"' in body
    assert "<b>vision-main</b> until " in body and "(version 1): capacity.a10g goes back to 4" in body
    assert "2\xa0days, 23\xa0hours" in body  # from now
    assert "# temporary: until " in current_yaml(as_alice)


def test_the_share_page_lists_the_versions_that_changed_it(as_alice, vision_share, language_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    layout.apply(plan_id=layout.plan(source=edited, run_whatif=False).pk)
    body = as_alice.get("/shares/vision-main/").content.decode()
    assert 'version 1: <code class="small">share vision-main changed: capacity.a10g 4 → 3</code>' in body
    assert "No recorded changes" in as_alice.get("/shares/language-main/").content.decode()


def test_the_plan_partial_polls_its_whatif(as_alice, vision_share, nodes, monkeypatch):
    from quotas import whatif

    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: None)
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    body = as_alice.post("/layout/plan/", {"document": edited}, HTTP_HX_REQUEST="true").content.decode()
    planned = layout.LayoutPlan.objects.get()
    assert f'hx-get="/whatif/{planned.whatif_run}/"' in body and 'data-testid="whatif-progress"' in body
    assert hx(as_alice, f"/layout/plans/{planned.pk}/").status_code == 200
    assert as_alice.get(f"/layout/plans/{planned.pk}/").status_code == 200  # a page of its own


def test_the_whatif_box_unticked_plans_without_the_replay(as_alice, vision_share, nodes, monkeypatch):
    from quotas import whatif

    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: None)
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    as_alice.post("/layout/plan/", {"document": edited, "whatif": ["0"]})  # the hidden field alone
    as_alice.post("/layout/plan/", {"document": edited, "whatif": ["0", "1"]})  # and the ticked box
    unticked, ticked = layout.LayoutPlan.objects.order_by("created_at")
    assert unticked.whatif_run == "" and ticked.whatif_run != ""
    assert 'type="hidden" name="whatif" value="0"' in as_alice.get("/layout/").content.decode()


def test_a_plan_that_over_commits_asks_apply_anyway(as_alice, vision_share, language_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 10}")
    planned = layout.plan(source=edited, run_whatif=False)
    response = as_alice.post(f"/layout/plans/{planned.pk}/apply/", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 400 and 'data-testid="layout-confirm"' in body
    assert "this plan over-commits a10g" in body and "Apply anyway" in body
    assert Share.objects.get(name="vision-main").capacity_map() == {"a10g": 4}
    response = as_alice.post(f"/layout/plans/{planned.pk}/apply/", {"confirm": "1"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and Share.objects.get(name="vision-main").capacity_map() == {
        "a10g": 10
    }


def test_the_layout_before_version_1_has_its_rollback(as_alice, vision_share, language_share, nodes):
    edited = current_yaml(as_alice).replace("capacity: {a10g: 4}", "capacity: {a10g: 3}")
    planned = layout.plan(source=edited, run_whatif=False)
    layout.apply(plan_id=planned.pk)
    body = as_alice.get("/layout/").content.decode()
    row = body.split('data-testid="layout-before-first">', 1)[1].split("</tr>", 1)[0]
    assert "the layout before version 1" in row and 'name="rollback" value="0"' in row
    response = as_alice.post("/layout/plan/", {"rollback": "0", "whatif": "0"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200, response.content
    assert "(a rollback to the layout before version 1)" in response.content.decode()


def test_the_versions_the_readme_names_and_a_layout_entry_in_the_navigation(as_alice, as_bob, vision_share):
    # The README's /layout/versions/ was a 404, and nothing linked to /layout/.
    r = as_alice.get("/layout/versions/")
    assert r.status_code == 302 and r["Location"] == "/layout/#versions-h"
    assert "/layout/versions/" in (Path(settings.BASE_DIR) / "README.md").read_text()
    page = as_alice.get("/layout/").content.decode()
    assert '<a href="/layout/" aria-current="page">Layout</a>' in page
    assert ">Shares</a>" in page and 'aria-current="page">Shares' not in page
    assert 'href="/layout/"' not in as_bob.get("/teams/vision/").content.decode()  # admins only
    assert as_bob.get("/layout/versions/").status_code == 403
