"""What a job may ask a GPU host to run: argv lists, a shell only when asked, valid env names, and
bounded sizes (issue 8). Checked at the API, where the values come in."""

import pytest

from jobs import services
from jobs.models import Job

URL = "/api/v1/jobs/"


def body(**kw):
    return {"share": "vision-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"], **kw}


@pytest.fixture
def post(world):
    from tests.security.conftest import client_as

    client = client_as(world, "member")

    def post(**kw):
        return client.post(URL, body(**kw), format="json")

    return post


def test_a_command_string_is_refused(post):
    r = post(command="rm -rf / --no-preserve-root")
    assert r.status_code == 400 and "command" in r.json()


def test_an_empty_command_is_refused(post):
    assert post(command=[]).status_code == 400


def test_a_command_is_stored_and_sent_as_argv(post):
    r = post(command=["echo", "$HOME; touch /tmp/pwned"])
    assert r.status_code == 201
    job = Job.objects.get(pk=r.json()["id"])
    assert job.command == ["echo", "$HOME; touch /tmp/pwned"] and job.use_shell is False


def test_a_shell_only_when_asked_and_as_one_string(post):
    assert post(command=["echo a", "b"], use_shell=True).status_code == 400
    r = post(command=["echo a && echo b"], use_shell=True)
    assert r.status_code == 201 and r.json()["use_shell"] is True


@pytest.mark.parametrize(
    "name",
    ["1ABC", "A-B", "A B", "A=B", "", "PATH;rm", "Ä", "X" * 129, "CUDA_VISIBLE_DEVICES", "GPUQUOTA_NODE"],
)
def test_bad_or_reserved_env_names_are_refused(post, name):
    r = post(env={name: "1"})
    assert r.status_code == 400 and "env" in r.json(), name


def test_nul_characters_are_refused(post):
    assert post(command=["echo", "a\x00b"]).status_code == 400
    assert post(env={"A": "a\x00b"}).status_code == 400


@pytest.mark.parametrize(
    "kw",
    [
        {"command": ["x"] * (services.MAX_COMMAND_ARGS + 1)},
        {"command": ["x" * (services.MAX_COMMAND_BYTES + 1)]},
        {"env": {f"V{i}": "1" for i in range(services.MAX_ENV_VARS + 1)}},
        {"env": {"BIG": "x" * (services.MAX_ENV_BYTES + 1)}},
        {"name": "n" * (services.MAX_NAME + 1)},
    ],
    ids=["args", "command-bytes", "env-vars", "env-bytes", "name"],
)
def test_sizes_are_limited(post, kw):
    r = post(**kw)
    assert r.status_code in (400, 413), r.content[:200]
    assert not Job.objects.filter(name=kw.get("name", "-")).exists()


def test_a_body_over_the_request_limit_is_413(post, settings):
    r = post(env={"BIG": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    assert r.status_code == 413


def test_limits_at_the_edge_are_accepted(post):
    r = post(
        command=["x"] * services.MAX_COMMAND_ARGS,
        env={f"V{i}": "1" for i in range(services.MAX_ENV_VARS)},
        name="n" * services.MAX_NAME,
    )
    assert r.status_code == 201, r.content[:300]
