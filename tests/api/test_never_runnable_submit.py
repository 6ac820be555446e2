"""A job its share can never hold (SEMANTICS "Forecast": refused at submit) is a 400 on the API, a form
error beside the field, and a CLI exit 2 (tests/client/test_cli_never_runnable.py); the words say why."""

import pytest

from jobs.models import Job
from quotas.choices import Strategy
from tests.conftest import make_share

URL = "/api/v1/jobs/"


@pytest.fixture
def vision_prod(vision):
    return make_share(vision, "vision-prod", capacity={"a10g": 2}, strategy=Strategy.RESERVE)


def submit(client, share, gpus):
    return client.post(
        URL, {"share": share, "gpus": gpus, "gpu_type": "a10g", "command": ["true"]}, format="json"
    )


def test_a_reserve_share_refuses_a_job_larger_than_its_capacity(as_bob, vision_prod, nodes):
    r = submit(as_bob, "vision-prod", 3)
    assert r.status_code == 400
    assert r.json() == {"gpus": ["vision-prod is RESERVE with 2 a10g: a 3-GPU job can never start there"]}
    assert not Job.objects.exists()
    assert submit(as_bob, "vision-prod", 2).status_code == 201


def test_a_lend_share_refuses_it_too(as_bob, vision, nodes):
    make_share(vision, "vision-lend", capacity={"a10g": 1}, strategy=Strategy.LEND)
    r = submit(as_bob, "vision-lend", 2)
    assert r.json() == {"gpus": ["vision-lend is LEND with 1 a10g: a 2-GPU job can never start there"]}


def test_a_borrower_is_refused_beyond_its_capacity_plus_borrow_limit(as_bob, vision, nodes):
    make_share(vision, "vision-lab", capacity={"a10g": 2}, borrow_limit=50)
    assert submit(as_bob, "vision-lab", 3).status_code == 201
    r = submit(as_bob, "vision-lab", 4)
    assert r.status_code == 400
    assert r.json()["gpus"] == [
        "vision-lab may hold at most 3 a10g (2 own, borrow limit 50%): a 4-GPU job can never start there"
    ]


def test_an_unlimited_borrower_takes_any_job_a_node_can_hold(as_bob, vision, nodes):
    make_share(vision, "vision-open", capacity={})
    assert submit(as_bob, "vision-open", 4).status_code == 201


def test_the_web_form_shows_the_reason_beside_the_gpus_field(client, bob, vision_prod, nodes):
    client.force_login(bob)
    data = {"share": "vision-prod", "gpu_type": "a10g", "gpus": "3", "priority": "0", "command": "true"}
    response = client.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="id_gpus-error"' in body
    assert "vision-prod is RESERVE with 2 a10g: a 3-GPU job can never start there" in body
    assert not Job.objects.exists()
