"""`gpuquota submit --image`: both parsers read it alike, and the submit sends it."""

import pytest

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
    from gpuquota_client.cli import cmd_submit, quick_submit_args

    argv = [a for a in ARGV if a not in ("--image", "reg.example.com/x:1")] if image is None else ARGV
    args = quick_submit_args(argv)
    sent = {}

    class Client:
        def submit(self, **body):
            sent.update(body)
            return {"id": 1, "state": "QUEUED", "name": "", "share": "s", "gpus": 1, "gpu_type": "a10g"}

    args.client = Client
    args.settings = dict
    args.json = True
    assert cmd_submit(args, lambda _: None) == 0
    assert sent.get("image") == image
