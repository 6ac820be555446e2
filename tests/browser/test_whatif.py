"""The what-if preview on a share's page: each click replaces the previous preview (the second click
did nothing: the button inherited the form's outerHTML swap), and editing the form takes a preview of
other values away. The replays run as tasks: here a thread per task stands in for the Celery worker,
so the page shows the run's progress, polls, and then the result; and a sweep draws its trade-off."""

import io

import pytest
from django.core.management import call_command

from tests.browser.conftest import login, screenshot
from tests.web.conftest import submit

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def worker(whatif_worker):
    """Each replay task runs in a thread of its own, as a worker would, once the gate is set."""
    return whatif_worker


@pytest.fixture
def history(db):
    """A small seeded week: 200 finished jobs, their own cluster and shares (hist-team-1, …)."""
    call_command("seed_history", jobs=200, stdout=io.StringIO())
    return "hist-team-1"


def test_a_preview_shows_its_progress_then_the_result(page, alice, history, worker):
    worker.clear()  # the replays wait: the page shows them going
    login(page, alice)
    page.goto(f"/shares/{history}/")
    page.get_by_role("button", name="Preview what if").click()
    progress = page.locator('[data-testid="whatif-progress"]')
    expect(progress).to_contain_text("Replayed 0 of 400 jobs (0 %)", timeout=10_000)
    expect(page.locator('[data-testid="whatif-run"]')).to_have_attribute("data-state", "running")
    screenshot(page, "whatif-progress")
    worker.set()
    expect(page.locator('[data-testid="whatif-shares"]')).to_contain_text(history, timeout=20_000)
    expect(progress).to_have_count(0)
    expect(page.locator('[data-testid="whatif-run"]')).to_have_attribute("data-state", "done")
    plots = page.locator('[data-plot="whatif"] .js-plotly-plot')
    expect(plots).to_have_count(2)
    expect(plots.first).to_be_visible()
    expect(page.locator("#whatif-result")).to_contain_text("Replayed 200 submissions")
    titles = [plots.nth(i).evaluate(AXES)["titles"]["y"] for i in range(2)]
    assert titles == ["GPU-hours run in the replayed window", "p95 wait (s)"], titles
    screenshot(page, "whatif-result")


def test_a_sweep_shows_bad_input_beside_the_field_then_progress_then_the_trade_off(
    page, alice, history, worker
):
    login(page, alice)
    page.goto(f"/shares/{history}/")
    page.get_by_label("Setting to sweep").select_option("strategy")
    page.get_by_label("Values").fill("RESERVE, HOARD")
    page.get_by_role("button", name="Sweep").click()
    expect(page.locator("#id_values-error")).to_contain_text("Not a strategy: HOARD")

    worker.clear()
    page.get_by_label("Values").fill("RESERVE, LEND, LEND_AND_BORROW")
    page.get_by_role("button", name="Sweep").click()
    expect(page.locator('[data-testid="whatif-progress"]')).to_contain_text("of 600 jobs", timeout=10_000)
    expect(page.locator("#id_values-error")).to_have_count(0)
    worker.set()
    table = page.locator('[data-testid="sweep-table"]')
    expect(table).to_contain_text("LEND_AND_BORROW", timeout=20_000)
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(page.locator('[data-plot="sweep"] .js-plotly-plot')).to_be_visible()
    expect(page.locator('[data-testid="sweep-run"]')).to_have_attribute("data-state", "done")
    axes = page.locator('[data-plot="sweep"] .js-plotly-plot').evaluate(AXES)
    # Each axis says what it shows; ticks are round numbers, not the wait axis's ticks mapped onto
    # the utilisation axis (24.6, 49.2).
    assert axes["titles"] == {
        "x": "Strategy",
        "y": f"p95 wait of {history} (s)",
        "y2": "cluster utilisation (%)",
    }, axes
    assert axes["y2"] == ["0", "20", "40", "60", "80", "100"], axes
    assert axes["y"] and all(t.replace(",", "").isdigit() for t in axes["y"]), axes
    screenshot(page, "whatif-sweep")


# A drawn chart's axis titles and tick labels, as the reader sees them.
AXES = """plot => {
  const texts = sel => [...plot.querySelectorAll(sel)].map(t => t.textContent.trim()).filter(Boolean);
  const title = sel => { const t = plot.querySelector(sel); return t ? t.textContent.trim() : null; };
  return {
    titles: {x: title(".g-xtitle text"), y: title(".g-ytitle text"), y2: title(".g-y2title text")},
    y: texts(".yaxislayer-above .ytick text"),
    y2: texts(".overaxes-above .y2tick text, .yaxislayer-above .y2tick text"),
  };
}"""


def test_preview_twice_each_preview_replaces_the_previous_one(page, alice, bob, vision_share, nodes):
    for _ in range(3):
        submit(bob, vision_share, gpus=2, max_runtime_s=600)
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    login(page, alice)
    page.goto(f"/shares/{vision_share.name}/")
    preview = page.get_by_role("button", name="Preview what if")
    shares_table = page.locator('[data-testid="whatif-shares"]')

    preview.click()
    expect(shares_table).to_contain_text("vision-main", timeout=20_000)
    page.get_by_label("a10g GPUs").fill("1")
    expect(shares_table).to_have_count(0)  # a preview of the old values is not left under the new ones

    preview.click()
    expect(shares_table).to_have_count(1, timeout=20_000)
    expect(page.locator('[data-testid="whatif-cluster"]')).to_have_count(1)
    preview.click()  # and a third time: still one preview, still there
    expect(shares_table).to_have_count(1, timeout=20_000)
    page.wait_for_load_state("networkidle")
    expect(shares_table).to_have_count(1)
    assert not [e for e in console_errors if "targetError" in e], console_errors
