"""A container job's read-only datasets: HOST[:CONTAINER] mounts allowed only by an admin's rule (the
cluster's ALLOWED_MOUNTS, the share's allowed_mounts in the layout), refused at submit with a 400 that
names the rule (a path with "..", a host path outside every allowed directory, a job without an image),
kept on the job and every task of an array, sent to the hosts in the start message; the form and the CLI
alike."""

import pytest

from gpunodes.dispatch import start_messages, start_payloads
from jobs.models import Job
from quotas.models import Share
from tests.api.test_layout import apply, export, plan

URL = "/api/v1/jobs/"
IMAGE = "registry.example.com/ml/train:1"


@pytest.fixture(autouse=True)
def images(settings):
    settings.ALLOWED_IMAGES = ["registry.example.com/ml/"]
    settings.ALLOWED_MOUNTS = ["/datasets/public"]


def body(**overrides):
    data = {
        "share": "vision-main",
        "gpus": 1,
        "gpu_type": "a10g",
        "command": ["python", "train.py"],
        "image": IMAGE,
    }
    data.update(overrides)
    return data


def test_a_mount_the_cluster_allows_is_kept_with_the_rule_that_allowed_it(as_bob, vision_share, nodes):
    r = as_bob.post(
        URL, body(mounts=["/datasets/public/imagenet:/data", "/datasets/public/coco"]), format="json"
    )
    assert r.status_code == 201, r.json()
    assert r.json()["mounts"] == [
        "/datasets/public/imagenet:/data",
        "/datasets/public/coco:/datasets/public/coco",
    ]
    assert Job.objects.get().mounts == [
        {"host": "/datasets/public/imagenet", "container": "/data", "allowed_by": "/datasets/public"},
        {
            "host": "/datasets/public/coco",
            "container": "/datasets/public/coco",
            "allowed_by": "/datasets/public",
        },
    ]


def test_a_cluster_rule_written_with_a_slash_is_its_directory(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_MOUNTS = ["/datasets/public/"]
    r = as_bob.post(URL, body(mounts=["/datasets/public/x:/data"]), format="json")
    assert r.status_code == 201, r.json()
    assert Job.objects.get().mounts[0]["allowed_by"] == "/datasets/public"


def test_a_mount_nothing_allows_is_refused_naming_the_rules(as_bob, vision_share, nodes):
    r = as_bob.post(URL, body(mounts=["/home/alice/data:/data"]), format="json")
    assert r.status_code == 400
    message = r.json()["mounts"][0]
    assert 'Mount "/home/alice/data" is not allowed here' in message
    assert "ALLOWED_MOUNTS allows /datasets/public" in message
    assert 'share "vision-main" allows none (allowed_mounts in the layout)' in message
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "mount, words",
    [
        ("/datasets/public/../../etc:/data", '".." part'),
        ("/datasets/public/./x:/data", '".." part'),
        ("/datasets/publicity:/data", "is not allowed here"),  # a prefix ends at a "/"
        ("datasets/public:/data", "is not absolute"),
        ("/datasets/public:data", "is not absolute"),
        ("/datasets/public:/etc", "may not be mounted"),
        ("/datasets/public:/", "may not be mounted"),
        ("/datasets/public:/proc/x", "may not be mounted"),
        ("/datasets/public:/data:ro", 'holds a ":"'),
        ("/datasets/public,rw:/data", 'holds a ":", a ","'),
    ],
)
def test_a_path_that_could_leave_the_allowed_directory_is_refused(as_bob, vision_share, nodes, mount, words):
    r = as_bob.post(URL, body(mounts=[mount]), format="json")
    assert r.status_code == 400, r.json()
    assert words in r.json()["mounts"][0], r.json()


def test_mounts_need_an_image_and_one_container_path_each(as_bob, vision_share, nodes):
    r = as_bob.post(URL, body(image="", mounts=["/datasets/public:/data"]), format="json")
    assert r.status_code == 400 and "name an image too" in r.json()["mounts"][0]
    r = as_bob.post(URL, body(mounts=["/datasets/public/a:/data", "/datasets/public/b:/data"]), format="json")
    assert r.status_code == 400 and 'Two mounts go to "/data"' in r.json()["mounts"][0]
    r = as_bob.post(URL, body(mounts=[f"/datasets/public/{i}" for i in range(9)]), format="json")
    assert r.status_code == 400 and "at most 8" in r.json()["mounts"][0]


def test_the_shares_rule_allows_a_mount_only_for_that_share(as_bob, vision_share, nodes, settings):
    settings.ALLOWED_MOUNTS = []
    Share.objects.filter(pk=vision_share.pk).update(allowed_mounts=["/datasets/vision"])
    r = as_bob.post(URL, body(mounts=["/datasets/vision/seg:/data"]), format="json")
    assert r.status_code == 201, r.json()
    assert Job.objects.get().mounts[0]["allowed_by"] == "/datasets/vision"


def test_every_task_of_an_array_has_the_mounts_and_the_start_message_carries_them(
    as_bob, vision_share, nodes
):
    r = as_bob.post(URL, body(mounts=["/datasets/public/x:/data"], array={"size": 2}), format="json")
    assert r.status_code == 201, r.json()
    stored = [{"host": "/datasets/public/x", "container": "/data", "allowed_by": "/datasets/public"}]
    assert list(Job.objects.values_list("mounts", flat=True)) == [stored, stored]
    payload = start_payload(mounts=stored)
    assert payload["mounts"] == stored
    from gpunodes.agent.tasks import Invalid, validate_start

    assert validate_start(payload)["mounts"] == stored
    with pytest.raises(Invalid, match="mounts"):
        validate_start({**payload, "image": ""})  # a host command mounts nothing
    with pytest.raises(Invalid, match="mounts"):
        validate_start({**payload, "mounts": [{"host": "x", "container": "/d", "allowed_by": "/"}]})
    assert start_messages([]) == []


def start_payload(**mounts):
    """The start message's payload of a one-GPU container job (with `mounts=` if given)."""
    return start_payloads(
        attempt_id=1,
        number=1,
        job_id=1,
        placement=[("n1", [0])],
        command=["t"],
        env={},
        use_shell=False,
        max_runtime_s=None,
        grace_s=30,
        image=IMAGE,
        **mounts,
    )[0]["payload"]


def test_a_job_without_mounts_sends_none(vision_share):
    assert "mounts" not in start_payload()


def test_allowed_mounts_are_planned_applied_and_exported_and_a_bad_one_is_a_400_at_its_path(
    as_alice, alice, bob, charlie, vision_share, language_share, nodes
):
    assert "allowed_mounts" not in export(as_alice)  # none yet: not in the document
    data = export(as_alice, "json")
    share = next(s for s in data["shares"] if s["name"] == "vision-main")
    share["allowed_mounts"] = ["/datasets/vision", "/models/public"]
    r = plan(as_alice, data)
    assert r.status_code == 201, r.json()
    assert apply(as_alice, r.json()["id"]).status_code == 200
    assert Share.objects.get(name="vision-main").allowed_mounts == ["/datasets/vision", "/models/public"]
    again = export(as_alice, "json")
    assert {s["name"]: s.get("allowed_mounts") for s in again["shares"]} == {
        "language-main": None,
        "vision-main": ["/datasets/vision", "/models/public"],
    }
    assert plan(as_alice, again).json()["changed"] is False
    for bad in ("/datasets", ["datasets/vision"], ["/datasets/../etc"], ["/a:b"], [3]):
        share["allowed_mounts"] = bad
        r = plan(as_alice, data)
        assert r.status_code == 400, (bad, r.content)
        assert any(path.endswith(".allowed_mounts") for path in r.json()), r.json()
