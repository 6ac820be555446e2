"""A share's allowed_images in the layout document: planned and applied like any setting, exported only
where a share has some (a layout without images reads and exports as before them), checked entry by
entry."""

import pytest

from quotas.models import Share
from tests.api.test_layout import URL, apply, export, plan


@pytest.fixture
def world(alice, bob, charlie, vision_share, language_share, nodes):
    return {"alice": alice}


def test_allowed_images_are_planned_applied_and_exported(as_alice, world):
    assert "allowed_images" not in export(as_alice)  # none yet: not in the document
    data = export(as_alice, "json")
    share = next(s for s in data["shares"] if s["name"] == "vision-main")
    share["allowed_images"] = ["ghcr.io/vision/", "registry.example.com/ml/train"]
    r = plan(as_alice, data)
    assert r.status_code == 201, r.json()
    assert r.json()["changed"] is True
    assert apply(as_alice, r.json()["id"]).status_code == 200
    assert Share.objects.get(name="vision-main").allowed_images == [
        "ghcr.io/vision/",
        "registry.example.com/ml/train",
    ]
    again = export(as_alice, "json")
    exported = {s["name"]: s.get("allowed_images") for s in again["shares"]}
    assert exported == {
        "language-main": None,
        "vision-main": ["ghcr.io/vision/", "registry.example.com/ml/train"],
    }
    assert plan(as_alice, again).json()["changed"] is False


@pytest.mark.parametrize("value", ["ghcr.io/x", ["Not A Prefix"], [3]])
def test_a_bad_entry_is_a_400_with_its_path(as_alice, world, value):
    data = export(as_alice, "json")
    data["shares"][1]["allowed_images"] = value
    r = plan(as_alice, data)
    assert r.status_code == 400, r.content
    assert any(path.endswith(".allowed_images") for path in r.json()), (r.json(), URL)
