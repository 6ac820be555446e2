"""One limit on every interface: the dashboard's submit form refuses what the API refuses, with a field
error (a Max runtime beyond the database's integer was a 500 from the form)."""

import pytest

from jobs.api.serializers import JobSubmitSerializer
from jobs.forms import SubmitForm
from jobs.limits import MAX_INT
from jobs.models import Job


def test_the_form_and_the_api_share_the_limits():
    form_field = SubmitForm.base_fields["max_runtime_s"]
    api_field = JobSubmitSerializer().fields["max_runtime_s"]
    assert form_field.max_value == api_field.max_value == MAX_INT


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
    assert "less than or equal to 2147483647" in response.content.decode()
    assert not Job.objects.exists()
