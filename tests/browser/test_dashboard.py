"""The dashboard in a real browser: log in, live overview with charts, submit and watch a job start,
cancel with confirmation, a share form's field error and the what-if preview, the nodes grid."""

import pytest

from jobs.choices import JobState
from jobs.models import Job
from quotas import usage
from quotas.models import Share
from tests.api.conftest import run
from tests.browser.conftest import login, screenshot
from tests.web.conftest import submit

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_overview_draws_charts_and_refreshes_live(page, alice, bob, vision_share, language_share, nodes):
    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    usage.sample()
    login(page, alice)
    expect(page.locator('[data-testid="used-a10g"]')).to_have_text("2")
    expect(page.locator('[data-plot="history"] .js-plotly-plot')).to_be_visible()
    expect(page.locator('[data-testid="no-lending"]')).to_be_visible()
    # A share starts borrowing: without a reload the numbers change and the Sankey appears.
    run(submit(bob, vision_share, gpus=2), nodes[0], [2, 3])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    expect(page.locator('[data-testid="used-a10g"]')).to_have_text("6", timeout=15_000)
    expect(page.locator('[data-plot="sankey"][data-drawn="1"] .js-plotly-plot')).to_be_visible(timeout=15_000)
    expect(page.locator("#sankey table")).to_contain_text("language-main")
    screenshot(page, "overview")


def test_member_submits_a_job_and_watches_it_start(page, bob, vision_share, nodes):
    login(page, bob)
    page.get_by_role("link", name="Teams").click()
    page.wait_for_url("**/teams/vision/")
    page.get_by_label("Name").fill("browser-job")
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_label("Command").fill("python train.py --steps 10")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#submit-form .ok")).to_contain_text("queued")
    queue = page.locator('[data-testid="queue"]')
    expect(queue).to_contain_text("browser-job")
    job = Job.objects.get(name="browser-job")
    assert job.state == JobState.QUEUED and job.gpus == 2
    screenshot(page, "team-queued")
    run(job, nodes[0], [0, 1])  # what the pass and the agent do
    expect(page.locator('[data-testid="running"]')).to_contain_text("browser-job", timeout=15_000)
    expect(queue).not_to_contain_text("browser-job")
    expect(page.locator('[data-testid="running"]')).to_contain_text("RUNNING")
    screenshot(page, "team-running")


def test_cancel_asks_for_confirmation(page, bob, vision_share, nodes):
    job = submit(bob, vision_share, name="to-cancel")
    login(page, bob)
    page.goto("/teams/vision/")
    row = page.locator(f'[data-testid="queue"] tr[data-job="{job.pk}"]')
    asked = []

    def dismiss_then_accept(dialog):
        asked.append(dialog.message)
        dialog.dismiss() if len(asked) == 1 else dialog.accept()

    page.on("dialog", dismiss_then_accept)
    row.get_by_role("button", name=f"Cancel job {job.pk}").click()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and asked == [f"Cancel job {job.pk} (to-cancel)?"]
    row.get_by_role("button", name=f"Cancel job {job.pk}").click()
    expect(page.locator(f'[data-testid="queue"] tr[data-job="{job.pk}"]')).to_have_count(0)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_admin_sees_a_field_error_previews_and_fixes_it(
    celery_eager, page, alice, bob, vision, vision_share, nodes
):
    for _ in range(3):
        submit(bob, vision_share, gpus=2, max_runtime_s=600)
    login(page, alice)
    page.goto("/shares/new/")
    page.get_by_label("Name").fill("vision-reserved")
    page.get_by_label("Team").select_option("vision")
    page.get_by_label("Strategy").select_option("RESERVE")
    page.get_by_label("Borrow limit").fill("50")
    page.get_by_label("a10g GPUs").fill("2")
    page.get_by_role("button", name="Save").click()
    error = page.locator("#id_borrow_limit-error")
    expect(error).to_contain_text("Only a LEND_AND_BORROW share borrows")
    assert not Share.objects.filter(name="vision-reserved").exists()
    page.get_by_label("Borrow limit").fill("-1")
    page.get_by_role("button", name="Preview what if").click()
    expect(page.locator('[data-testid="whatif-shares"]')).to_contain_text("vision-reserved", timeout=20_000)
    plots = page.locator('[data-plot="whatif"] .js-plotly-plot')  # GPU-hours run, and p95 wait
    expect(plots).to_have_count(2)
    expect(plots.first).to_be_visible()
    screenshot(page, "share-whatif")
    page.get_by_role("button", name="Save").click()
    page.wait_for_url("**/shares/")
    expect(page.locator('[data-testid="shares"]')).to_contain_text("vision-reserved")
    assert Share.objects.get(name="vision-reserved").strategy == "RESERVE"
    screenshot(page, "shares")


def test_nodes_grid_colours_and_hatches(page, alice, bob, vision_share, language_share, nodes):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=1), nodes[1], [0], borrowed=True)
    login(page, alice)
    page.get_by_role("link", name="Nodes").click()
    expect(page.locator(".gpu.hatched")).to_have_count(1)
    expect(page.locator('[data-node="node-1"] .gpu.free')).to_have_count(0)
    page.once("dialog", lambda d: d.accept())
    page.locator('[data-node="node-2"]').get_by_role("button", name="Cordon").click()
    expect(page.locator('[data-node="node-2"] .badge')).to_have_text("CORDONED")
    screenshot(page, "nodes")


def test_job_page_shows_timeline_and_log(page, bob, vision_share, nodes):
    from jobs.models import LogChunk

    job = submit(bob, vision_share, name="logged")
    attempt = run(job, nodes[0], [0])
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=0, text="step 1\n")
    login(page, bob)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator('[data-plot="timeline"] .js-plotly-plot')).to_be_visible()
    expect(page.locator('[data-testid="log"]')).to_contain_text("step 1")
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=7, text="step 2\n")
    expect(page.locator('[data-testid="log"]')).to_contain_text("step 2", timeout=15_000)
    screenshot(page, "job")
