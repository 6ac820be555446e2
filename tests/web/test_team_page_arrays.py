"""Job arrays on the team page: submitted from the form (one field), shown as one expandable row with
its counts per state, re-prioritised and cancelled as one."""

from jobs.choices import JobState
from jobs.models import Job, JobArray
from jobs.services import job_array_submit, job_submit
from tests.web.conftest import hx

FORM = {
    "share": "vision-main",
    "gpu_type": "a10g",
    "gpus": "1",
    "priority": "0",
    "command": "python sweep.py",
}


def test_the_form_submits_an_array(as_bob, vision_share, nodes):
    response = as_bob.post("/teams/vision/submit/", {**FORM, "array_size": "25"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    array = JobArray.objects.get()
    assert f"Array A{array.pk} queued: 25 tasks." in response.content.decode()
    assert Job.objects.filter(array=array).count() == 25


def test_an_array_over_the_limit_is_refused_beside_the_field(as_bob, vision_share, nodes, settings):
    settings.MAX_ARRAY_SIZE = 10
    response = as_bob.post("/teams/vision/submit/", {**FORM, "array_size": "11"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    body = response.content.decode()
    assert (
        'id="id_array_size-error"' in body
        and "An array has 1 to 10 tasks (MAX_ARRAY_SIZE); this one has 11." in body
    )
    assert not Job.objects.exists()


def test_the_queue_folds_an_array_into_one_row_with_counts(as_bob, bob, vision_share, nodes):
    array = job_array_submit(user=bob, share=vision_share, size=6, gpus=1, gpu_type="a10g", command=["x"])
    single = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["y"])
    first = Job.objects.filter(array=array).order_by("array_index").first()
    Job.objects.filter(pk=first.pk).update(state=JobState.SUCCEEDED)
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert body.count(f'data-array="{array.pk}"') == 1
    assert f'data-job="{single.pk}"' in body
    assert "5 queued" in body and "1 succeeded" in body
    for task in Job.objects.filter(array=array, state=JobState.QUEUED):
        assert f'data-job="{task.pk}"' not in body  # inside the array's row, not rows of their own
        assert f'href="/jobs/{task.pk}/"' in body


def test_cancel_all_and_priority_from_the_page(as_bob, bob, vision_share, nodes):
    array = job_array_submit(user=bob, share=vision_share, size=3, gpus=1, gpu_type="a10g", command=["x"])
    r = as_bob.post(f"/arrays/{array.pk}/priority/", {"priority": "8"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert set(Job.objects.values_list("priority", flat=True)) == {8}
    r = as_bob.post(f"/arrays/{array.pk}/cancel/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.CANCELLED}


def test_another_team_cannot_cancel_the_array(as_charlie, bob, vision_share, nodes):
    array = job_array_submit(user=bob, share=vision_share, size=2, gpus=1, gpu_type="a10g", command=["x"])
    assert as_charlie.post(f"/arrays/{array.pk}/cancel/").status_code == 404
    assert not Job.objects.filter(state=JobState.CANCELLED).exists()


def test_one_array_row_is_not_the_first_1_of_its_queued_tasks(as_bob, bob, vision_share, nodes):
    job_array_submit(user=bob, share=vision_share, size=5, gpus=1, gpu_type="a10g", command=["x"])
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert 'data-testid="queued-count">5 queued' in body
    assert "Showing the first" not in body  # the row stands for all five


def test_beyond_the_rows_shown_the_count_is_of_jobs_not_rows(as_bob, bob, vision_share, nodes, monkeypatch):
    monkeypatch.setattr("quotas.views.QUEUE_SHOWN", 3)
    job_array_submit(user=bob, share=vision_share, size=5, gpus=1, gpu_type="a10g", command=["x"])
    for _ in range(4):
        job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["y"])
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    # Three rows read: the array's first tasks fold into its one row (it stands for all 5 tasks), then
    # the singles as far as the rows allow.
    shown = body.split('data-testid="queue-shown">', 1)[1].split("</p>", 1)[0]
    assert shown == "Showing the first 5 of 9 queued jobs."


def test_the_share_cards_refresh_with_the_queue_after_a_submit(as_bob, vision_share, nodes):
    """The form's answer triggers queue-changed: the cards follow at once, not up to 3 s later (the
    queue said "5 queued" beside a card's "0 queued")."""
    body = as_bob.get("/teams/vision/").content.decode()
    cards = body.split('<section id="cards"', 1)[1].split(">", 1)[0]
    queue = body.split('<section id="team-queue"', 1)[1].split(">", 1)[0]
    assert 'hx-trigger="every 3s, queue-changed from:body"' in cards
    assert "queue-changed from:body" in queue
    response = as_bob.post("/teams/vision/submit/", {**FORM, "array_size": "5"}, HTTP_HX_REQUEST="true")
    assert response["HX-Trigger"] == "queue-changed"
    card = hx(as_bob, "/teams/vision/?part=cards").content.decode()
    assert "5 queued" in card.split('data-share="vision-main"', 1)[1]
