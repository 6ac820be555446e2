"""Issue 30, finding 8: /nodes/ showed every team's running job ids and names in its GPU tooltips, to
members of other teams, for jobs whose pages answer them 404. Now a GPU names its job only to those who
may see the job (its team's members, admins); others see the share using it. Issue 31: a LOST node's
GPUs read "free"; they are not usable, and say so."""

import re

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from tests.api.conftest import run
from tests.web.conftest import logged_in, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def secret_job(bob, vision_share, nodes):
    job = submit(bob, vision_share, gpus=2, name="secret-vision-model")
    run(job, nodes[0], [0, 1])
    return job


def titles(client) -> list[str]:
    return re.findall(r'<li class="gpu [^"]*" title="([^"]*)"', client.get("/nodes/").content.decode())


def test_another_team_sees_the_share_but_not_the_job(charlie, secret_job):
    as_charlie = logged_in(charlie)
    assert as_charlie.get(f"/jobs/{secret_job.pk}/").status_code == 404  # the job's own page
    body = as_charlie.get("/nodes/").content.decode()
    assert "secret-vision-model" not in body and f"job {secret_job.pk}" not in body
    assert titles(as_charlie)[:2] == ["GPU 0: share vision-main", "GPU 1: share vision-main"]


def test_the_jobs_team_and_admins_see_the_job(bob, alice, secret_job):
    for user in (bob, alice):
        shown = titles(logged_in(user))[:2]
        assert shown == [
            f"GPU {i}: share vision-main, job {secret_job.pk} secret-vision-model" for i in (0, 1)
        ]


def test_the_htmx_refresh_hides_it_too(charlie, secret_job):
    body = logged_in(charlie).get("/nodes/?part=grid", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="grid"' in body and "secret-vision-model" not in body and f"job {secret_job.pk}" not in body


def test_a_lost_nodes_gpus_do_not_read_free(bob, nodes):
    Node.objects.filter(name="node-2").update(state=NodeState.LOST)
    body = logged_in(bob).get("/nodes/").content.decode()
    node2 = body[body.index('data-node="node-2"') :]
    node2 = node2[: node2.index("</article>")]
    assert ">free<" not in node2 and node2.count(">lost<") == 4
    assert "GPU 0: node lost: not usable until its agent is heard again" in node2
    node1 = body[body.index('data-node="node-1"') : body.index('data-node="node-2"')]
    assert node1.count(">free<") == 4
