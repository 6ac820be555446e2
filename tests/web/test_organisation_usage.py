"""/usage/ shows borrowed GPU-hours per GPU type, group and share against their fair part: rule 5's
split by weight x max(1, capacity of the type), as the organisation page (issue 37, item 4)."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from quotas import layout, organisation, usage
from quotas.models import UsageSample
from tests.conftest import make_share

pytestmark = pytest.mark.django_db


def hourly(share, gpu_type: str, *, borrowed: float, capacity: int, hours_ago: float = 2) -> None:
    """An hour of minute samples of `share` borrowing `borrowed` GPUs of `gpu_type`."""
    start = timezone.now() - timedelta(hours=hours_ago)
    for minute in range(60):
        UsageSample.objects.create(
            at=start + timedelta(minutes=minute),
            share=share,
            gpu_type=gpu_type,
            own=capacity,
            borrowed=borrowed,
            capacity=capacity,
        )


def cells_of(table: str, name: str) -> list[str]:
    row = re.search(rf'<tr data-name="{name}">(.*?)</tr>', table, re.S).group(1)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


@pytest.fixture
def borrowed_hour(alice, vision, vision_share, language_share):
    """research holds vision-main (weight 2, 4 a10g) and vision-b (weight 1, 1 a10g), lang holds
    language-main (2 a10g); over the last hour vision-main borrowed 3 a10g and vision-b 1, and vision-b
    also 2 h100 (it has none of its own); language-main borrowed nothing."""
    b = make_share(vision, "vision-b", capacity={"a10g": 1})
    data = layout.load_live().layout.to_data()
    data["groups"] = [{"name": "lang"}, {"name": "research"}]
    for s in data["shares"]:
        s["group"] = "lang" if s["name"] == "language-main" else "research"
    next(s for s in data["shares"] if s["name"] == "vision-main")["weight"] = 2
    layout.apply(plan_id=layout.plan(source=data, actor=alice, run_whatif=False).pk, actor=alice)
    hourly(vision_share, "a10g", borrowed=3, capacity=4)
    hourly(b, "a10g", borrowed=1, capacity=1)
    hourly(b, "h100", borrowed=2, capacity=0)
    hourly(language_share, "a10g", borrowed=0, capacity=2)


def test_borrowed_by_type_keeps_the_types_apart_within_the_window(borrowed_hour, vision_share):
    hourly(vision_share, "a10g", borrowed=5, capacity=4, hours_ago=30)  # before the window: not counted
    now = timezone.now()
    by_type = usage.borrowed_by_type(now - timedelta(days=1), now)
    assert by_type == {
        "a10g": {"vision-main": pytest.approx(3), "vision-b": pytest.approx(1)},
        "h100": {"vision-b": pytest.approx(2)},
    }


def test_borrowing_by_tree_splits_each_level_by_weight_times_capacity(borrowed_hour):
    sections = organisation.borrowing_by_tree({"a10g": {"vision-main": 3.0, "vision-b": 1.0}})
    assert [s["gpu_type"] for s in sections] == ["a10g"]
    rows = {r["name"]: r for r in sections[0]["rows"]}
    assert [r["name"] for r in sections[0]["rows"]] == [
        "lang",
        "language-main",
        "research",
        "vision-b",
        "vision-main",
    ]
    assert rows["research"]["borrowed"] == 4 and rows["research"]["fair_part"] == 4  # alone at the top
    assert rows["research"]["capacity"] == 5  # its shares' a10g
    assert rows["lang"]["fair_part"] is None  # it did not borrow: no part
    # 4 GPU-hours between weight 2 x 4 a10g = 8 and weight 1 x 1 a10g = 1: parts 32/9 and 4/9, where
    # the plain weights (2 of 3) would have said 8/3 and 4/3
    assert rows["vision-main"]["fair_part"] == pytest.approx(32 / 9)
    assert rows["vision-b"]["fair_part"] == pytest.approx(4 / 9)
    assert rows["vision-main"]["competing_fair_weight"] == 9
    assert rows["vision-main"]["words"] == "weight 2 × 4 a10g of capacity = 8 of 9 among those that borrowed"
    assert rows["language-main"]["words"] == "weight 1 × 2 a10g of capacity = 2"
    assert organisation.borrowing_by_tree({}) == []
    assert organisation.borrowing_by_tree({"a10g": {"vision-main": 0.0}}) == []  # nobody borrowed


def test_borrowing_by_tree_counts_no_capacity_of_the_type_as_one(borrowed_hour):
    sections = organisation.borrowing_by_tree(
        {"a10g": {"vision-main": 3.0}, "h100": {"vision-b": 2.0, "vision-main": 2.0}}
    )
    assert [s["gpu_type"] for s in sections] == ["a10g", "h100"]
    h100 = {r["name"]: r for r in sections[1]["rows"]}
    # No h100 anywhere: each counts as weight x 1, so the plain weights split it, 2 of 3 and 1 of 3
    assert h100["vision-main"]["fair_part"] == pytest.approx(8 / 3)
    assert h100["vision-b"]["fair_part"] == pytest.approx(4 / 3)
    assert h100["vision-b"]["words"] == "weight 1 × 1 (no h100 of its own) = 1 of 3 among those that borrowed"
    a10g = {r["name"]: r for r in sections[0]["rows"]}
    assert a10g["vision-b"]["borrowed"] == 0 and a10g["vision-b"]["fair_part"] is None


def test_two_shares_of_equal_weight_that_borrowed_in_proportion_to_capacity_are_at_their_part(
    as_alice, alice, vision, language
):
    """Equal weights, capacities 8 and 2, borrowed 8 and 2 GPU-hours: rule 5 evens 8/8 and 2/2 out, so
    each is exactly at its fair part (a weight-only split would have said 5 and 5)."""
    hourly(make_share(vision, "big", capacity={"a10g": 8}), "a10g", borrowed=8, capacity=8)
    hourly(make_share(language, "small", capacity={"a10g": 2}), "a10g", borrowed=2, capacity=2)
    rows = {
        r["name"]: r
        for r in organisation.borrowing_by_tree(
            usage.borrowed_by_type(timezone.now() - timedelta(days=1), timezone.now())
        )[0]["rows"]
    }
    assert rows["big"]["fair_part"] == pytest.approx(8) and rows["big"]["ratio"] == pytest.approx(1.0)
    assert rows["small"]["fair_part"] == pytest.approx(2) and rows["small"]["ratio"] == pytest.approx(1.0)
    html = as_alice.get("/usage/?days=1").content.decode()
    table = html.split('data-testid="usage-tree" data-gpu-type="a10g"')[1].split("</table>")[0]
    assert cells_of(table, "big") == [
        "big",
        "8.0",
        "8.0",
        "weight 1 × 8 a10g of capacity = 8 of 10 among those that borrowed",
    ]
    assert cells_of(table, "small") == [
        "small",
        "2.0",
        "2.0",
        "weight 1 × 2 a10g of capacity = 2 of 10 among those that borrowed",
    ]


def test_the_usage_page_shows_the_tree_per_type_with_the_fair_parts(as_alice, borrowed_hour):
    html = as_alice.get("/usage/?days=1").content.decode()
    a10g = html.split('data-testid="usage-tree" data-gpu-type="a10g"')[1].split("</table>")[0]
    assert cells_of(a10g, "vision-main") == [
        "vision-main",
        "3.0",
        "3.6",
        "weight 2 × 4 a10g of capacity = 8 of 9 among those that borrowed",
    ]
    assert "<strong>group research</strong>" in a10g
    h100 = html.split('data-testid="usage-tree" data-gpu-type="h100"')[1].split("</table>")[0]
    assert cells_of(h100, "vision-b")[:3] == ["vision-b", "2.0", "2.0"]  # alone: all of it
    assert "weight × capacity of the type" in html


def test_the_usage_page_says_when_nothing_was_borrowed(as_alice, vision_share):
    html = as_alice.get("/usage/?days=1").content.decode()
    assert 'data-testid="usage-tree-empty"' in html and 'data-testid="usage-tree"' not in html
