"""The dashboard's submit form takes datasets (one HOST[:CONTAINER] a line): allowed ones are queued and
shown on the job's page as read-only, a refused one is the form's field error in the rule's words."""

import pytest

from jobs.models import Job

FORM = {"gpu_type": "a10g", "gpus": 1, "priority": 0, "command": "python train.py"}
IMAGE = "registry.example.com/ml/train:1"


@pytest.mark.django_db
def test_allowed_datasets_are_queued_and_shown_on_the_job_page(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES, settings.ALLOWED_MOUNTS = ["registry.example.com/ml/"], ["/datasets"]
    data = {
        **FORM,
        "share": vision_share.name,
        "image": IMAGE,
        "mounts": "/datasets/a:/data\r\n\r\n/datasets/b\r\n",
    }
    response = as_bob.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 200, response.content.decode()[:500]
    job = Job.objects.get()
    assert [m["host"] for m in job.mounts] == ["/datasets/a", "/datasets/b"]
    page = as_bob.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>/datasets/a:/data</code> (read-only)" in page


@pytest.mark.django_db
def test_a_refused_dataset_is_a_field_error(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES, settings.ALLOWED_MOUNTS = ["registry.example.com/ml/"], ["/datasets"]
    data = {**FORM, "share": vision_share.name, "image": IMAGE, "mounts": "/datasets/../etc:/data"}
    response = as_bob.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "&quot;..&quot; part" in response.content.decode() or '".." part' in response.content.decode()
    assert not Job.objects.exists()
