"""One limit on every interface: the dashboard's submit form refuses what the API refuses, with a field
error in the same words (a Max runtime beyond the database's integer was a 500 from the form)."""

import pytest

from jobs import limits
from jobs.api.serializers import JobSubmitSerializer
from jobs.forms import SubmitForm
from jobs.models import Job


@pytest.mark.parametrize("field", ["gpus", "priority", "max_runtime_s", "preemption_grace_s"])
def test_the_form_and_the_api_share_the_limits(field):
    form_field = SubmitForm.base_fields[field]
    api_field = JobSubmitSerializer().fields[field]
    assert form_field.limit == api_field.limit == limits.JOB_LIMITS[field]


@pytest.mark.django_db
def test_a_huge_max_runtime_is_a_field_error_not_a_500(as_bob, vision_share):
    response = as_bob.post(
        "/teams/vision/submit/",
        {
            "share": vision_share.name,
            "gpu_type": "a10g",
            "gpus": 1,
            "priority": 0,
            "command": "python train.py",
            "max_runtime_s": "99999999999999999999",
        },
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 400
    assert "max_runtime_s is 1 to 2,147,483,647 seconds." in response.content.decode()
    assert not Job.objects.exists()


def _csrf_client(user):
    """A browser's view of the form: CSRF enforced, the token sent in htmx's header (hx-headers), so
    the body is read where a browser's is, in the CSRF middleware, before the view."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/teams/vision/")
    return client, client.cookies["csrftoken"].value


@pytest.mark.django_db
@pytest.mark.parametrize("htmx", [True, False])
def test_a_submit_over_the_body_limit_gives_the_form_back_with_the_limit_in_words(
    bob, vision_share, caplog, htmx
):
    import logging

    client, token = _csrf_client(bob)
    headers = {"HTTP_X_CSRFTOKEN": token, **({"HTTP_HX_REQUEST": "true"} if htmx else {})}
    data = {"share": vision_share.name, "gpu_type": "a10g", "gpus": 1, "command": "x" * 300_000}
    with caplog.at_level(logging.INFO):
        response = client.post("/teams/vision/submit/", data, **headers)
    body = response.content.decode()
    assert response.status_code == 400
    assert 'id="submit-form"' in body and "Bad Request" not in body
    error = body.split('data-testid="form-error">', 1)[1].split("</div>", 1)[0]
    assert "is larger than 256 KiB, the most one request may carry" in error
    assert ("<html" in body) is not htmx  # htmx swaps the form; without it, a page around it
    assert not Job.objects.exists()
    assert [r.levelname for r in caplog.records if r.levelno >= logging.WARNING] == ["WARNING"]
    assert not any(r.exc_info for r in caplog.records)


@pytest.mark.django_db
def test_a_body_over_the_limit_elsewhere_is_the_limit_in_words(alice, vision_share):
    from django.test import Client

    client = Client()
    client.force_login(alice)
    response = client.post(f"/shares/{vision_share.name}/", {"name": "x" * 300_000})
    assert response.status_code == 400 and response["Content-Type"].startswith("text/plain")
    assert "larger than 256 KiB" in response.content.decode()


def test_sizes_read_in_words():
    from quotas.views import bytes_words

    assert [bytes_words(n) for n in (300, 262_144, 300_000, 1_572_864)] == [
        "300 bytes",
        "256 KiB",
        "293 KiB",
        "1.5 MiB",
    ]
