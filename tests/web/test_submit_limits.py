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
