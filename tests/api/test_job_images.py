"""Submitting a job that names a container image: allowed only by an admin's rule (the cluster's
ALLOWED_IMAGES, the share's allowed_images), refused with a 400 that names the rules, kept on the job
and on every task of an array."""

import pytest

from jobs.models import Job
from quotas.models import Share

URL = "/api/v1/jobs/"


def body(**overrides):
    data = {"share": "vision-main", "gpus": 1, "gpu_type": "a10g", "command": ["python", "train.py"]}
    data.update(overrides)
    return data


def test_an_image_nothing_allows_is_refused_naming_the_rules(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES = []
    r = as_bob.post(URL, body(image="registry.example.com/ml/train:1"), format="json")
    assert r.status_code == 400
    message = r.json()["image"][0]
    assert "ALLOWED_IMAGES allows none" in message
    assert 'share "vision-main" allows none' in message
    assert not Job.objects.exists()


def test_the_clusters_rule_allows_an_image(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES = ["registry.example.com/ml/"]
    r = as_bob.post(URL, body(image="registry.example.com/ml/train:1"), format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["image"] == "registry.example.com/ml/train:1"
    assert Job.objects.get().image == "registry.example.com/ml/train:1"


def test_the_shares_rule_allows_an_image_only_for_that_share(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES = []
    Share.objects.filter(pk=vision_share.pk).update(allowed_images=["ghcr.io/vision"])
    assert (
        as_bob.post(URL, body(image="ghcr.io/vision/seg@sha256:" + "a" * 64), format="json").status_code
        == 201
    )
    # A prefix ends at a path, tag or digest boundary: ghcr.io/vision does not allow ghcr.io/visionary.
    r = as_bob.post(URL, body(image="ghcr.io/visionary/x:1"), format="json")
    assert r.status_code == 400
    assert 'share "vision-main" allows ghcr.io/vision' in r.json()["image"][0]


@pytest.mark.parametrize("image", ["python:3.11", "ubuntu", "Registry.example.com/x", "reg.example.com/x y"])
def test_a_short_or_malformed_name_is_refused(as_bob, vision_share, nodes, settings, image):
    settings.ALLOWED_IMAGES = ["registry.example.com/", "python", "ubuntu"]
    r = as_bob.post(URL, body(image=image), format="json")
    assert r.status_code == 400
    assert "fully qualified image name" in r.json()["image"][0]


def test_no_image_runs_on_the_host_as_before(as_bob, vision_share, nodes):
    r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 201
    assert r.json()["image"] == ""


def test_every_task_of_an_array_has_the_image(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES = ["localhost:5000/"]
    r = as_bob.post(URL, body(image="localhost:5000/bb:1", array={"size": 3}), format="json")
    assert r.status_code == 201, r.json()
    assert list(Job.objects.values_list("image", flat=True)) == ["localhost:5000/bb:1"] * 3
    r = as_bob.post(URL, body(image="localhost:5001/bb:1", array={"size": 3}), format="json")
    assert r.status_code == 400 and "not allowed here" in r.json()["image"][0]
