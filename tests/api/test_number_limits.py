"""A number too large says the largest allowed (issue 42.6): DRF said "String value too large." of a
number of more than 1,000 digits, Django's forms "Enter a whole number." of one of more than 4,300; both
now give the field's maximum, as for any number over it (config.numbers)."""

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

MAX = 2**31 - 1
TOO_LARGE = f"Ensure this value is less than or equal to {MAX}."


@pytest.mark.parametrize("digits", [20, 2000, 5000])
def test_the_api_gives_the_maximum(as_alice, vision_share, digits):
    r = as_alice.patch("/api/v1/shares/vision-main/", {"borrow_limit": "9" * digits}, format="json")
    assert r.status_code == 400 and r.json() == {"borrow_limit": [TOO_LARGE]}


@pytest.mark.parametrize("digits", [20, 5000])
def test_a_form_gives_the_maximum(alice, vision, nodes, digits):
    client = Client()
    client.force_login(alice)
    data = {
        "name": "vision-batch",
        "team": "vision",
        "description": "",
        "strategy": "LEND",
        "borrow_limit": "-1",
        "state": "ENABLED",
        "cap_a10g": "9" * digits,
    }
    response = client.post("/shares/new/", data)
    assert response.status_code == 400
    assert f"Ensure this value is less than or equal to {MAX}." in response.content.decode()


def test_what_is_no_number_still_says_so(as_alice, vision_share):
    r = as_alice.patch("/api/v1/shares/vision-main/", {"borrow_limit": "x" * 2000}, format="json")
    assert r.status_code == 400 and r.json()["borrow_limit"] != [TOO_LARGE]
