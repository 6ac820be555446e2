"""The shares page and form: a share's protection window (min_runtime_s) set, shown, and refused beside
its field in the limit's own words."""

import pytest

from quotas.models import Share

pytestmark = pytest.mark.django_db

FORM = {
    "name": "vision-main",
    "team": "vision",
    "description": "",
    "strategy": "LEND_AND_BORROW",
    "borrow_limit": "-1",
    "state": "ENABLED",
    "cap_a10g": "4",
}


def test_the_form_sets_the_window_and_the_list_shows_it(as_alice, vision_share, nodes):
    page = as_alice.get("/shares/vision-main/").content.decode()
    assert 'name="min_runtime_s"' in page and 'value="0"' in page
    r = as_alice.post("/shares/vision-main/", dict(FORM, min_runtime_s="600"), HTTP_HX_REQUEST="true")
    assert r.status_code == 204
    assert Share.objects.get(name="vision-main").min_runtime_s == 600
    listing = as_alice.get("/shares/").content.decode()
    assert 'data-testid="protects-vision-main"' in listing and "protected 10 min" in listing


@pytest.mark.parametrize(
    "value, words",
    [
        ("-5", "min_runtime_s is 0 to 86,400 seconds"),
        ("100000", "min_runtime_s is 0 to 86,400 seconds"),
        ("10m", "Enter a whole number."),
    ],
)
def test_a_bad_window_is_refused_beside_its_field(as_alice, vision_share, nodes, value, words):
    r = as_alice.post("/shares/vision-main/", dict(FORM, min_runtime_s=value), HTTP_HX_REQUEST="true")
    assert r.status_code == 400
    body = r.content.decode()
    assert 'id="id_min_runtime_s-error"' in body and words in body
    assert Share.objects.get(name="vision-main").min_runtime_s == 0


def test_left_empty_it_is_no_protection(as_alice, vision_share, nodes):
    Share.objects.filter(name="vision-main").update(min_runtime_s=60)
    r = as_alice.post("/shares/vision-main/", dict(FORM, min_runtime_s=""), HTTP_HX_REQUEST="true")
    assert r.status_code == 204 and Share.objects.get(name="vision-main").min_runtime_s == 0
