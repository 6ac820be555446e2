"""`gpuquota submit --image`: both parsers read it alike, and the submit sends it."""

import pytest

from tests.client.conftest import cli_submit

ARGV = [
    "submit",
    "--share",
    "s",
    "--gpus",
    "1",
    "--gpu-type",
    "a10g",
    "--image",
    "reg.example.com/x:1",
    "--",
    "t",
]


def test_the_quick_parser_and_argparse_read_the_image():
    from gpuquota_client.cli import build_parser, quick_submit_args

    quick = quick_submit_args(ARGV)
    assert quick.image == "reg.example.com/x:1"
    assert vars(quick) == vars(build_parser().parse_args(ARGV))


@pytest.mark.parametrize("image", [None, "reg.example.com/x:1"])
def test_the_submit_sends_the_image_only_when_given(image):
    argv = [a for a in ARGV if a not in ("--image", "reg.example.com/x:1")] if image is None else ARGV
    code, sent = cli_submit(argv)
    assert code == 0
    assert sent.get("image") == image
