"""One picture of lent and borrowed on every page (issue: the card said borrowed 1, the nodes page
hatched 2 GPUs, the job page still said borrowed after the team page said own). A share of capacity 3
running two 2-GPU jobs uses 4: it borrows 1 GPU, and its latest-started job is the borrowed one."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.services import node_grid
from jobs import lifecycle
from jobs.choices import Outcome
from quotas import usage
from tests.api.conftest import run
from tests.conftest import make_share
from tests.web.conftest import hx, submit


@pytest.fixture
def share3(vision):
    return make_share(vision, "vision-three", capacity={"a10g": 3})


@pytest.fixture
def two_jobs(bob, share3, nodes):
    early = timezone.now() - timedelta(minutes=5)
    first = run(submit(bob, share3, gpus=2, name="first"), nodes[0], [0, 1], started_at=early)
    second = run(submit(bob, share3, gpus=2, name="second"), nodes[0], [2, 3], borrowed=True)
    return first, second


# The legend under the running jobs shows a badge of its own: rows are counted before it.
LEGEND = 'data-testid="borrowed-legend"'


def card_borrowed(share: str) -> int:
    card = next(c for c in usage.cluster_picture().cards if c.name == share)
    return sum(b.borrowed for b in card.bars)


@pytest.mark.django_db
def test_the_nodes_page_hatches_as_many_gpus_as_the_card_counts_borrowed(two_jobs, as_bob):
    hatched = [g for row in node_grid() for g in row["gpus"] if g["borrowed"]]
    assert card_borrowed("vision-three") == 1
    assert len(hatched) == 1
    body = as_bob.get("/nodes/").content.decode()
    assert "hatched: borrowed, a GPU its share uses beyond its own capacity" in body
    assert body.count('hatched"') + body.count(" hatched ") - body.count("gpu-key s0 hatched") == 1


@pytest.mark.django_db
def test_the_team_page_labels_the_latest_started_job_borrowed(two_jobs, as_bob):
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    running = body.split('data-testid="running"', 1)[1].split(LEGEND, 1)[0]
    assert running.count('class="badge borrowed"') == 1
    second_row = running.split(f'data-job="{two_jobs[1].job_id}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="badge borrowed"' in second_row
    assert 'data-testid="borrowed-legend"' in body


@pytest.mark.django_db
def test_the_job_page_follows_the_policy_once_the_other_job_ends(two_jobs, as_bob):
    first, second = two_jobs
    page = as_bob.get(f"/jobs/{second.job_id}/").content.decode()
    assert 'class="badge borrowed"' in page.split('data-testid="borrowed-1"', 1)[1].split("</td>", 1)[0]
    assert 'data-testid="borrowed-legend"' in page

    lifecycle.end_attempt(first.pk, first.number, outcome=Outcome.SUCCEEDED, exit_code=0)
    page = as_bob.get(f"/jobs/{second.job_id}/").content.decode()
    cell = page.split('data-testid="borrowed-1"', 1)[1].split("</td>", 1)[0]
    assert 'class="badge own"' in cell and "admitted borrowed" in cell
    team = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    team = team.split('data-testid="running"', 1)[1].split(LEGEND, 1)[0]
    assert 'class="badge borrowed"' not in team
    assert card_borrowed("vision-three") == 0


@pytest.mark.django_db
def test_whole_gpu_counts_print_as_integers(as_bob, vision_share, nodes):
    body = as_bob.get("/").content.decode()
    assert "idle <b>4</b>" in body and "4.0" not in body
    assert 'data-testid="borrowed-legend"' in body
