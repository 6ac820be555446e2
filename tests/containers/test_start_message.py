"""The image and the datasets travel from the job to its host: the pass's start message and a resent one
carry them (only where the job has some), and the agent takes it only as an image name, never as an option (no podman
needed)."""

import pytest

from gpunodes.agent.tasks import Invalid, validate_start
from gpunodes.dispatch import start_messages
from jobs.services import job_submit
from tests.quotas import test_scheduler as scheduler_suite

fresh, sent, run = scheduler_suite.fresh, scheduler_suite.sent, scheduler_suite.run  # its fixtures

IMAGE = "registry.example.com/ml/train:1.4"


def test_the_pass_sends_the_image_and_a_resent_start_has_it_too(
    bob,
    vision_share,
    fresh,
    sent,
    settings,
    django_capture_on_commit_callbacks,
):
    settings.ALLOWED_IMAGES = ["registry.example.com/ml/"]
    job = job_submit(
        user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["python", "t.py"], image=IMAGE
    )
    plain = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    run(django_capture_on_commit_callbacks)
    by_job = {kw["kwargs"]["job_id"]: kw["kwargs"] for name, kw in sent if name.endswith("start_attempt")}
    assert by_job[job.pk]["image"] == IMAGE and "image" not in by_job[plain.pk]
    assert validate_start(by_job[job.pk])["image"] == IMAGE
    assert validate_start(by_job[plain.pk])["image"] == ""
    [resent] = start_messages([job.attempts.get().pk])
    assert resent["payload"]["image"] == IMAGE
    assert "mounts" not in by_job[job.pk] and validate_start(by_job[job.pk])["mounts"] == []


def test_the_pass_and_a_resent_start_carry_the_datasets(
    bob, vision_share, fresh, sent, settings, django_capture_on_commit_callbacks
):
    settings.ALLOWED_IMAGES, settings.ALLOWED_MOUNTS = ["registry.example.com/ml/"], ["/datasets"]
    job = job_submit(
        user=bob,
        share=vision_share,
        gpus=1,
        gpu_type="a10g",
        command=["python", "t.py"],
        image=IMAGE,
        mounts=["/datasets/imagenet:/data"],
    )
    run(django_capture_on_commit_callbacks)
    [message] = [kw["kwargs"] for name, kw in sent if name.endswith("start_attempt")]
    stored = [{"host": "/datasets/imagenet", "container": "/data", "allowed_by": "/datasets"}]
    assert message["mounts"] == stored and validate_start(message)["mounts"] == stored
    [resent] = start_messages([job.attempts.get().pk])
    assert resent["payload"]["mounts"] == stored


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "reg.example.com/x y", 3, "A" * 300])
def test_the_agent_refuses_an_image_that_is_not_a_name(image):
    message = {"attempt_id": 1, "number": 1, "job_id": 1, "command": ["true"], "image": image}
    with pytest.raises(Invalid, match="image"):
        validate_start(message)


def test_a_pull_report_shows_on_the_job_while_it_waits_and_only_from_its_node(
    bob, vision_share, fresh, sent, settings, django_capture_on_commit_callbacks
):
    from jobs.models import Job
    from jobs.tasks import attempt_pulling

    settings.ALLOWED_IMAGES = ["registry.example.com/ml/"]
    job = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["t"], image=IMAGE)
    run(django_capture_on_commit_callbacks)
    attempt = job.attempts.get()
    node = attempt.placement[0]["node"]
    other = "node-2" if node == "node-1" else "node-1"
    assert attempt_pulling(attempt.pk, 1, other, "pulling image forged") is False
    said = f"pulling image {IMAGE}, 1.2 of 3.4 GB"
    assert attempt_pulling(attempt.pk, 1, node, said) is True
    assert Job.objects.get(pk=job.pk).state_reason == said
    assert attempt_pulling(attempt.pk, 2, node, "pulling image of another attempt") is False
    # ...shown where the job is read: its page and the API.
    from django.test import Client

    web = Client()
    web.force_login(bob)
    assert said in web.get(f"/jobs/{job.pk}/").content.decode()
    data = web.get(f"/api/v1/jobs/{job.pk}/").json()
    assert data["state_reason"] == said
    # (`gpuquota status` prints the same state_reason and the datasets: tests/client/test_cli_mount.py)
