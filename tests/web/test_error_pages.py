"""403 and 404 in the dashboard's layout, with the reason and a way back (they were Django's bare
pages, and said "No Job matches the given query.")."""

import pytest


@pytest.mark.django_db
def test_a_403_says_why_in_the_dashboard_layout(as_charlie):
    response = as_charlie.get("/shares/")
    body = response.content.decode()
    assert response.status_code == 403
    assert 'class="brand"' in body and 'data-testid="error-page"' in body
    assert "Only admins can manage shares" in body
    assert 'href="/">Back to the overview' in body


@pytest.mark.django_db
def test_a_404_for_another_teams_job_says_so_with_a_way_back(as_charlie, bob, vision_share, nodes):
    from tests.web.conftest import submit

    job = submit(bob, vision_share)
    body = as_charlie.get(f"/jobs/{job.pk}/").content.decode()
    assert "No such job among your teams" in body and 'class="brand"' in body


@pytest.mark.django_db
def test_a_404_never_shows_djangos_query_wording(as_alice):
    response = as_alice.get("/jobs/999999/")
    body = response.content.decode()
    assert response.status_code == 404
    assert "matches the given query" not in body
    assert "There is nothing at /jobs/999999/" in body


@pytest.mark.django_db
def test_an_unknown_address_is_a_404_page_in_the_layout(as_alice):
    body = as_alice.get("/no/such/page/").content.decode()
    assert "There is nothing at /no/such/page/" in body and 'class="brand"' in body
