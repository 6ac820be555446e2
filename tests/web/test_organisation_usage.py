"""/usage/ shows borrowed GPU-hours per group and share against their weighted part (issue 37, item 4)."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from quotas import layout, organisation
from quotas.models import UsageSample
from tests.conftest import make_share

pytestmark = pytest.mark.django_db


@pytest.fixture
def borrowed_hour(alice, vision, vision_share, language_share):
    """research holds vision-main (weight 2) and vision-b (weight 1), lang holds language-main; over the
    last hour vision-main borrowed 3 GPUs and vision-b 1, language-main nothing."""
    b = make_share(vision, "vision-b", capacity={"a10g": 1})
    data = layout.load_live().layout.to_data()
    data["groups"] = [{"name": "lang"}, {"name": "research"}]
    for s in data["shares"]:
        s["group"] = "lang" if s["name"] == "language-main" else "research"
    next(s for s in data["shares"] if s["name"] == "vision-main")["weight"] = 2
    layout.apply(plan_id=layout.plan(source=data, actor=alice, run_whatif=False).pk, actor=alice)
    start = timezone.now() - timedelta(hours=2)
    for minute in range(60):
        at = start + timedelta(minutes=minute)
        UsageSample.objects.create(at=at, share=vision_share, gpu_type="a10g", own=4, borrowed=3, capacity=4)
        UsageSample.objects.create(at=at, share=b, gpu_type="a10g", own=1, borrowed=1, capacity=1)
        UsageSample.objects.create(at=at, share=language_share, gpu_type="a10g", lent=2, capacity=2)


def test_borrowing_by_tree_splits_each_level_by_weight(borrowed_hour):
    rows = {r["name"]: r for r in organisation.borrowing_by_tree({"vision-main": 3.0, "vision-b": 1.0})}
    assert [r["name"] for r in organisation.borrowing_by_tree({})] == [
        "lang",
        "language-main",
        "research",
        "vision-b",
        "vision-main",
    ]
    assert rows["research"]["borrowed"] == 4 and rows["research"]["weighted_part"] == 4  # alone at the top
    assert rows["lang"]["weighted_part"] is None  # it did not borrow: no part
    # 4 GPU-hours between weights 2 and 1: parts 8/3 and 4/3
    assert rows["vision-main"]["weighted_part"] == pytest.approx(8 / 3)
    assert rows["vision-b"]["weighted_part"] == pytest.approx(4 / 3)
    assert rows["vision-main"]["competing_weight"] == 3


def test_the_usage_page_shows_the_tree_with_the_weighted_parts(as_alice, borrowed_hour):
    html = as_alice.get("/usage/?days=1").content.decode()
    table = html.split('data-testid="usage-tree"')[1].split("</table>")[0]
    row = re.search(r'<tr data-name="vision-main">(.*?)</tr>', table, re.S).group(1)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells == ["vision-main", "3.0", "2.7", "2 of 3 among those that borrowed"]
    assert "<strong>group research</strong>" in table
