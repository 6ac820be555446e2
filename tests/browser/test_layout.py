"""Layout seen in a real browser, asserted on boxes and text (no screenshots): what a reader sees must
not overlap or vanish."""

import pytest

from tests.browser.conftest import login

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The badge's box, its text's box, and the line boxes of the words on either side of it.
BADGE_BOXES = """badge => {
  const box = r => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
  const range = node => { const r = document.createRange(); r.selectNodeContents(node); return r; };
  const around = [badge.previousSibling, badge.nextSibling].filter(n => n && n.nodeType === Node.TEXT_NODE);
  return {
    badge: box(badge.getBoundingClientRect()),
    text: box(range(badge).getBoundingClientRect()),
    neighbours: around.flatMap(n => [...range(n).getClientRects()].map(box)),
  };
}"""


def _overlap(a, b) -> bool:
    return (
        a["left"] < b["right"] - 1
        and b["left"] < a["right"] - 1
        and a["top"] < b["bottom"] - 1
        and (b["top"] < a["bottom"] - 1)
    )


def test_borrowed_legend_badge_holds_its_word_beside_its_sentence(page, alice, vision_share, nodes):
    login(page, alice)
    badge = page.locator('[data-testid="borrowed-legend"] .badge.borrowed')
    boxes = badge.evaluate(BADGE_BOXES)
    b, t = boxes["badge"], boxes["text"]
    assert b["left"] <= t["left"] + 1 and t["right"] <= b["right"] + 1, boxes  # the word inside its badge
    assert boxes["neighbours"], boxes
    assert not [n for n in boxes["neighbours"] if _overlap(n, b)], boxes


# A bar's words and what lies under them: the bar's fill, or its pattern's background and hatch lines.
BAR_COLOURS = """(plot, word) => {
  const text = [...plot.querySelectorAll(".bartext")].find(t => t.textContent.includes(word));
  const path = text.parentNode.querySelector("path");
  const fill = getComputedStyle(path).fill;
  const out = {text: getComputedStyle(text).fill, fill: fill, hatch: null};
  const id = (fill.match(/url\\("?#([^")]+)"?\\)/) || [])[1];
  if (id) {
    const pattern = plot.querySelector("pattern#" + CSS.escape(id));
    const rect = pattern.querySelector("rect"), line = pattern.querySelector("path");
    out.fill = rect ? rect.getAttribute("fill") : "rgb(255, 255, 255)";  // no background: the white card's
    out.hatch = {colour: line.getAttribute("stroke"), opacity: parseFloat(line.getAttribute("opacity") || "1")};
  }
  return out;
}"""


def _rgb(css: str) -> tuple[float, ...]:
    return tuple(float(v) for v in css[css.index("(") + 1 : css.index(")")].split(",")[:3])


def _contrast(a, b) -> float:
    """WCAG 2 contrast ratio of two sRGB colours."""

    def luminance(rgb):
        c = [v / 255 for v in rgb]
        c = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_label_on_a_hatched_stopping_bar_can_be_read(page, bob, vision_share, nodes):
    from jobs.choices import AttemptState
    from jobs.models import Attempt
    from tests.api.conftest import run
    from tests.web.conftest import submit

    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    job = submit(bob, vision_share)
    attempt = run(job, nodes[1], [0], borrowed=True)  # beyond vision's 4: borrowed, hatched
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.STOPPING)
    login(page, bob)
    page.goto(f"/jobs/{job.pk}/")
    plot = page.locator('[data-plot="timeline"][data-drawn="1"] .js-plotly-plot')
    sync_api.expect(plot).to_be_visible()
    colours = plot.evaluate(BAR_COLOURS, "STOPPING")
    assert colours["hatch"] is not None, colours  # hatched: borrowed
    text, fill = _rgb(colours["text"]), _rgb(colours["fill"])
    assert _contrast(text, fill) >= 4.5, colours  # WCAG AA for text on the bar
    line, alpha = _rgb(colours["hatch"]["colour"]), colours["hatch"]["opacity"]
    crossing = tuple(alpha * c + (1 - alpha) * f for c, f in zip(line, fill, strict=True))
    assert _contrast(text, crossing) >= 3, colours  # where a hatch line crosses the words


# How much of the x axis the data covers, and the y axis' title.
HISTORY_SPREAD = """plot => {
  const layout = plot._fullLayout, data = plot._fullData;
  const ms = v => new Date(String(v).replace(" ", "T") + (String(v).includes("Z") || /[+-]\\d\\d:\\d\\d$/.test(v) ? "" : "Z")).getTime();
  const xs = data.flatMap(t => [...t.x]).map(ms);
  const [lo, hi] = layout.xaxis.range.map(ms);
  const title = plot.querySelector(".g-ytitle text");
  return {covered: (Math.max(...xs) - Math.min(...xs)) / (hi - lo), ytitle: title ? title.textContent : null};
}"""


def test_a_young_clusters_history_fills_the_chart(page, alice, vision_share, nodes):
    from datetime import timedelta

    from django.utils import timezone

    from quotas.models import UsageSample

    now = timezone.now()
    for minutes in range(20, -1, -1):  # a cluster 20 minutes old
        UsageSample.objects.create(
            at=now - timedelta(minutes=minutes), share=vision_share, gpu_type="a10g", own=2
        )
    login(page, alice)
    plot = page.locator('[data-plot="history"][data-drawn="1"] .js-plotly-plot')
    sync_api.expect(plot).to_be_visible()
    sync_api.expect(page.locator("#history-h")).to_contain_text("since")
    spread = plot.evaluate(HISTORY_SPREAD)
    assert spread["covered"] > 0.85, spread  # was 20 minutes of 24 hours: 1.4 %
    assert spread["ytitle"] == "GPUs", spread
