"""The dashboard's submit form takes an image: an allowed one is queued and shown on the job's page, a
refused one is the form's field error in the rule's words."""

import pytest

from jobs.models import Job

FORM = {"gpu_type": "a10g", "gpus": 1, "priority": 0, "command": "python train.py"}


@pytest.mark.django_db
def test_an_allowed_image_is_queued_and_shown_on_the_job_page(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES = ["registry.example.com/ml/"]
    data = {**FORM, "share": vision_share.name, "image": "registry.example.com/ml/train:1"}
    response = as_bob.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 200, response.content.decode()[:500]
    job = Job.objects.get()
    assert job.image == "registry.example.com/ml/train:1"
    page = as_bob.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="job-image"><code>registry.example.com/ml/train:1</code>' in page


@pytest.mark.django_db
def test_a_refused_image_is_a_field_error(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES = []
    data = {**FORM, "share": vision_share.name, "image": "docker.io/library/python:3.11"}
    response = as_bob.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "is not allowed here" in response.content.decode()
    assert not Job.objects.exists()
