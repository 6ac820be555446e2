"""`gpuquota submit --mount HOST[:CONTAINER]`: both parsers read it alike (repeatable), the submit sends
it with the image, and a malformed one or one without --image is a usage error (exit 2) before any
request."""

import pytest

from tests.client.conftest import cli_submit as submit

ARGV = ["submit", "--share", "s", "--gpus", "1", "--gpu-type", "a10g", "--image", "reg.example.com/x:1"]
MOUNTS = ["--mount", "/datasets/a:/data", "--mount", "/datasets/b"]


def test_the_quick_parser_and_argparse_read_the_mounts():
    from gpuquota_client.cli import build_parser, quick_submit_args

    argv = [*ARGV, *MOUNTS, "--", "t"]
    quick = quick_submit_args(argv)
    assert quick.mount == ["/datasets/a:/data", "/datasets/b"]
    assert vars(quick) == vars(build_parser().parse_args(argv))


def test_the_submit_sends_the_mounts_with_the_image():
    code, sent = submit([*ARGV, *MOUNTS, "--", "t"])
    assert code == 0 and sent["mounts"] == ["/datasets/a:/data", "/datasets/b"]
    code, sent = submit([*ARGV, "--", "t"])
    assert code == 0 and "mounts" not in sent


def test_a_mount_without_an_image_is_a_usage_error():
    from gpuquota_client.cli import UsageError

    with pytest.raises(UsageError, match="--image"):
        submit([a for a in ARGV if a not in ("--image", "reg.example.com/x:1")] + [*MOUNTS, "--", "t"])


@pytest.mark.parametrize("mount", ["data:/x", "/datasets/a:data", "/datasets/../etc"])
def test_a_malformed_mount_exits_2(mount, capsys):
    from gpuquota_client.cli import main

    with pytest.raises(SystemExit) as e:
        main([*ARGV, "--mount", mount, "--", "t"])
    assert e.value.code == 2
    assert "HOST[:CONTAINER]" in capsys.readouterr().err


def test_status_shows_the_image_the_datasets_and_the_pulls_bytes():
    from types import SimpleNamespace

    from gpuquota_client.cli import cmd_status

    job = {
        "id": 7,
        "name": "",
        "share": "s",
        "team": "t",
        "submitted_by": "bob",
        "submitted_at": None,
        "gpus": 1,
        "gpu_type": "a10g",
        "priority": 0,
        "state": "ADMITTED",
        "state_reason": "pulling image reg.example.com/x:1, 1.2 of 3.4 GB",
        "command": ["t"],
        "image": "reg.example.com/x:1",
        "mounts": ["/datasets/a:/data"],
        "max_runtime_s": None,
        "attempt_count": 1,
        "preemption_count": 0,
        "exit_code": None,
        "attempts": [],
        "events": [],
    }
    printed = []
    args = SimpleNamespace(job=("job", 7), json=False, client=lambda: SimpleNamespace(job=lambda _: job))
    assert cmd_status(args, printed.append) == 0
    text = "\n".join(map(str, printed))
    assert "reason: pulling image reg.example.com/x:1, 1.2 of 3.4 GB" in text, text
    assert "datasets: /datasets/a:/data" in text and "image: reg.example.com/x:1" in text, text
