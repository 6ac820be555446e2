"""Submitting a job: what a member may submit, and every bad input's 400 with its field message."""

import json

import pytest

from jobs.choices import JobState
from jobs.models import Job
from quotas import services as quota_services
from quotas.choices import ShareState

URL = "/api/v1/jobs/"


def body(**overrides):
    data = {
        "share": "vision-main",
        "gpus": 2,
        "gpu_type": "a10g",
        "command": ["python", "train.py", "--lr", "3e-4"],
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not ...}


def test_a_member_submits_a_job(as_bob, bob, vision_share, nodes):
    r = as_bob.post(
        URL, body(name="resnet", priority=5, env={"SEED": "1"}, max_runtime_s=7200), format="json"
    )
    assert r.status_code == 201, r.json()
    job = r.json()
    assert (job["state"], job["share"], job["submitted_by"], job["gpus"], job["priority"]) == (
        JobState.QUEUED,
        "vision-main",
        "bob",
        2,
        5,
    )
    assert job["command"] == ["python", "train.py", "--lr", "3e-4"]
    assert job["env"] == {"SEED": "1"}
    assert job["queue_position"] is None  # the submit skips the forecast: a read gives it
    assert [e["kind"] for e in job["events"]] == ["SUBMITTED"]
    assert Job.objects.get(pk=job["id"]).submitted_by == bob
    quota_services.forecast_refresh()  # what the control worker stores after a pass
    assert as_bob.get(f"{URL}{job['id']}/").json()["queue_position"] == {"in_share": 1, "overall": 1}


def test_the_forecast_comes_after_the_next_pass_not_in_the_submit_answer(as_bob, vision_share, nodes):
    r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 201
    assert (r.json()["queue_position"], r.json()["eta_kind"]) == (None, None)
    quota_services.forecast_refresh()
    detail = as_bob.get(f"{URL}{r.json()['id']}/").json()
    assert detail["queue_position"] == {"in_share": 1, "overall": 1}
    assert detail["eta_kind"] in ("bound", "estimate")


def test_an_admin_submits_to_any_share(as_alice, language_share, nodes):
    assert as_alice.post(URL, body(share="language-main"), format="json").status_code == 201


def test_a_member_of_another_team_gets_403(as_charlie, vision_share, nodes):
    r = as_charlie.post(URL, body(), format="json")
    assert r.status_code == 403
    assert r.json()["detail"] == 'You are not a member of team "Vision", which owns share "vision-main".'
    assert not Job.objects.exists()


def test_anonymous_gets_401(anon, vision_share, nodes):
    assert anon.post(URL, body(), format="json").status_code == 401


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"share": "nope"}, "share", 'No share named "nope". Shares you can submit to: vision-main.'),
        ({"share": ...}, "share", "This field is required."),
        ({"share": ["vision-main"]}, "share", "Give the share by its name."),
        ({"gpu_type": "h100"}, "gpu_type", 'No node has GPU type "h100". Known node shapes: 2 × 4 a10g.'),
        ({"gpu_type": "A100!"}, "gpu_type", "A GPU type is a lower-case name such as a10g or h100."),
        ({"gpus": 0}, "gpus", "Ask for 1 to 4,096 GPUs."),
        ({"gpus": -3}, "gpus", "Ask for 1 to 4,096 GPUs."),
        ({"gpus": "two"}, "gpus", "A valid integer is required."),
        (
            {"gpus": 6},
            "gpus",
            "6 GPUs do not fit on one a10g node (largest has 4); a larger job must ask for "
            "whole nodes, a multiple of 4. Known node shapes: 2 × 4 a10g.",
        ),
        (
            {"gpus": 12},
            "gpus",
            "12 GPUs need 3 whole 4-GPU a10g nodes but only 2 exist. Known node shapes: 2 × 4 a10g.",
        ),
        ({"gpus": 10**12}, "gpus", "Ask for 1 to 4,096 GPUs."),
        ({"priority": 10000}, "priority", "Priority is an integer from 0 to 9999."),
        ({"priority": -1}, "priority", "Priority is an integer from 0 to 9999."),
        ({"priority": 1.5}, "priority", "A valid integer is required."),
        ({"command": []}, "command", "Give the command as a non-empty list of arguments."),
        ({"command": "python train.py"}, "command", 'Expected a list of items but got type "str".'),
        (
            {"env": {"CUDA_VISIBLE_DEVICES": "0"}},
            "env",
            "CUDA_VISIBLE_DEVICES is set by gpuquota for every attempt.",
        ),
        ({"env": {"1BAD": "x"}}, "env", '"1BAD" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*).'),
        ({"env": ["A=1"]}, "env", 'Expected a dictionary of items but got type "list".'),
        ({"max_runtime_s": 0}, "max_runtime_s", "max_runtime_s is 1 to 2,147,483,647 seconds."),
        ({"preemption_grace_s": -1}, "preemption_grace_s", "The grace period is 0 to 3,600 seconds"),
        ({"preemption_grace_s": 3601}, "preemption_grace_s", "The grace period is 0 to 3,600 seconds"),
        (
            {"max_preemptions": -2},
            "max_preemptions",
            "max_preemptions is -1 (unlimited) or 0 to 2,147,483,647.",
        ),
        ({"name": "x" * 201}, "name", "Ensure this field has no more than 200 characters."),
        ({"gpu": 2}, "gpu", "Unknown field."),
        ({"state": "RUNNING"}, "state", "Unknown field."),
    ],
)
def test_bad_input_is_a_400_with_the_fields_message(as_bob, vision_share, nodes, overrides, field, message):
    r = as_bob.post(URL, body(**overrides), format="json")
    assert r.status_code == 400, r.json()
    errors = r.json()[field]
    flat = [
        m
        for v in (errors.values() if isinstance(errors, dict) else errors)
        for m in (v if isinstance(v, list) else [v])
    ]
    assert any(m.startswith(message) for m in flat), errors
    assert not Job.objects.exists()


def test_a_disabled_share_refuses_new_jobs(as_bob, vision_share, nodes):
    vision_share.state = ShareState.DISABLED
    vision_share.save()
    r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 400
    assert r.json()["share"] == ['Share "vision-main" is disabled and takes no new jobs.']


def test_every_bad_field_is_reported_at_once(as_bob, vision_share, nodes):
    r = as_bob.post(URL, body(gpus=0, priority=10**4, env={"CUDA_VISIBLE_DEVICES": "1"}), format="json")
    assert r.status_code == 400
    assert set(r.json()) == {"gpus", "priority", "env"}


def test_no_registered_node_says_so(as_bob, vision_share):
    r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 400
    assert r.json()["gpu_type"] == [
        'No node has GPU type "a10g". Known node shapes: no GPU nodes are registered.'
    ]


@pytest.mark.parametrize("raw", ["{", '{"share": "vision-main",}', "NaN", b"\xff\xfe", "[" * 50_000])
def test_malformed_json_is_a_400(as_bob, vision_share, nodes, raw):
    r = as_bob.post(URL, raw, content_type="application/json")
    assert r.status_code == 400
    assert r.json()["detail"].startswith("JSON parse error")


@pytest.mark.parametrize("raw", ["[1, 2]", '"text"', "null", "3"])
def test_a_body_that_is_not_an_object_is_a_400(as_bob, vision_share, nodes, raw):
    r = as_bob.post(URL, raw, content_type="application/json")
    assert r.status_code == 400
    assert "non_field_errors" in r.json() or "share" in r.json()


def test_a_form_body_is_refused_with_415(as_bob, vision_share, nodes):
    r = as_bob.post(URL, {"share": "vision-main"})  # multipart
    assert r.status_code == 415


def test_an_oversized_body_is_a_413(as_bob, vision_share, nodes, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    raw = json.dumps(body(env={"PAD": "x" * 2000}))
    r = as_bob.post(URL, raw, content_type="application/json")
    assert r.status_code == 413
    assert r.json()["detail"] == "The request body is larger than 1024 bytes."
    assert not Job.objects.exists()


def test_an_oversized_body_is_a_413_whatever_the_content_type(as_bob, vision_share, nodes, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    r = as_bob.post(URL, "x" * 5000, content_type="text/plain")
    assert r.status_code == 413


def test_submits_are_throttled_per_user_with_retry_after(
    as_bob, as_charlie, vision_share, language_share, nodes, monkeypatch
):
    monkeypatch.setattr("jobs.api.views.SubmitThrottle.rate", "2/min", raising=False)
    for _ in range(2):
        assert as_bob.post(URL, body(), format="json").status_code == 201
    r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 429
    assert 0 < int(r["Retry-After"]) <= 60
    assert "Expected available in" in r.json()["detail"]
    # Per user: charlie's submits are counted apart from bob's. Reads are not throttled.
    assert as_charlie.post(URL, body(share="language-main"), format="json").status_code == 201
    assert as_bob.get(URL).status_code == 200
