"""GET /api/v1/ lists the endpoints (it answered 404); /favicon.ico is not a 404 on every page."""

from django.test import Client


def test_the_api_root_lists_its_endpoints(db):
    response = Client().get("/api/v1/")
    assert response.status_code == 200
    body = response.json()
    for name in ("jobs", "shares", "teams", "nodes", "queue", "auth/token", "audit"):
        assert body["endpoints"][name] == f"http://testserver/api/v1/{name}/"
    assert body["schema"] == "http://testserver/api/schema/"
    assert Client().get(body["endpoints"]["jobs"]).status_code in (401, 403)  # the list is not the data


def test_the_favicon_is_found(db):
    response = Client().get("/favicon.ico", follow=True)
    assert response.status_code == 200
    assert b"<svg" in b"".join(response.streaming_content if response.streaming else [response.content])


def test_a_missing_object_is_said_in_plain_words(as_bob):
    response = as_bob.get("/api/v1/jobs/999999/")
    assert response.status_code == 404
    assert response.json() == {"detail": "No such job."}


def test_an_unknown_format_is_a_406_that_names_the_formats_not_a_404(as_alice, vision_share):
    """DRF's own answer to ?format=x is a 404, as if the list did not exist (the schema fuzz found it on
    /api/v1/usage/): every API view says what it takes instead."""
    for url, takes in [
        ("/api/v1/jobs/", "format must be json."),
        ("/api/v1/usage/", "format must be json or csv."),
        ("/api/v1/layout/", "format must be json or yaml."),
    ]:
        r = as_alice.get(url, {"format": "A"})
        assert (r.status_code, r.json()["detail"]) == (406, takes), url
        assert as_alice.get(url).status_code == 200, url


def test_a_format_suffix_in_the_path_names_no_resource_and_stays_a_404(as_alice):
    assert as_alice.patch("/api/v1/arrays/0.5/", {"priority": 0}, format="json").status_code == 404
