"""A fresh `gpuquota` process starts light: `--version` and a plain `submit` import none of the heavy
standard modules (argparse, re, json, socket, urllib, pathlib, typing, ...); the quick submit parser
gives exactly argparse's result or leaves the command line to argparse; quickjson is json."""

import json
import os
import subprocess
import sys

import pytest

from jobs.models import Job
from tests.client.conftest import CLIENT_SRC

HEAVY = {
    "argparse",
    "re",
    "json",
    "ssl",
    "http.client",
    "urllib",
    "urllib.parse",
    "pathlib",
    "typing",
    "socket",
    "selectors",
    "shutil",
    "gettext",
    "locale",
    "datetime",
    "requests",
    "encodings.idna",
}


def imported(config_file, *args) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m gpuquota_client ARGS`: its result and every module it imported."""
    env = dict(os.environ, PYTHONPATH=str(CLIENT_SRC), GPUQUOTA_CONFIG=str(config_file))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpuquota_client", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done, modules


def test_version_imports_nothing_heavy(config_file):
    done, modules = imported(config_file, "--version")
    assert done.returncode == 0 and done.stdout == "gpuquota 0.1.0\n"
    assert "gpuquota_client.cli" in modules
    assert not modules & HEAVY, modules & HEAVY


def test_a_plain_submit_imports_nothing_heavy(logged_in, config_file):
    args = ("submit", "--share", "vision-main", "--gpus", "1", "--gpu-type", "a10g", "--name", "x")
    done, modules = imported(config_file, *args, "--", "python", "train.py")
    assert done.returncode == 0, done.stderr[-2000:]
    job = Job.objects.get()
    assert done.stdout.startswith(f"Submitted job {job.pk} x: QUEUED")
    assert job.command == ["python", "train.py"] and job.name == "x"
    assert "gpuquota_client.client" in modules
    assert not modules & HEAVY, modules & HEAVY
    # --json prints the server's JSON: json is imported then, and only then.
    done, modules = imported(config_file, "--json", *args, "--", "true")
    assert done.returncode == 0 and json.loads(done.stdout)["command"] == ["true"]
    assert "json" in modules and "argparse" not in modules


SUBMIT = ["submit", "--share", "s", "--gpus", "2", "--gpu-type", "a10g"]
PLAIN = [
    [*SUBMIT, "--", "python", "train.py"],
    [*SUBMIT, "python", "train.py", "--lr", "3"],
    ["--json", "--url", "http://x:1", "--config", "/tmp/c.json", *SUBMIT, "--", "true"],
    ["--url=http://x:1", "--config=c.json", *SUBMIT, "--", "true"],
    ["submit", "--gpu-type", "a10g", "--gpus=4", "--share=s", "--name", "n", "--priority", "7", "--", "x"],
    [*SUBMIT, "-e", "A=1", "--env", "B=2", "--env=C=3=4", "--forecast", "--", "true", "--", "x"],
    [*SUBMIT, "--max-runtime", "1h30m", "--grace", "0", "--array", "0-9", "--", "true"],
    [*SUBMIT, "--share", "t", "--name", "", "--", "true"],
    [*SUBMIT, "--"],  # no command: cmd_submit says so
]
OTHER = [
    [*SUBMIT, "--sha", "s", "--", "true"],  # an abbreviation
    [*SUBMIT, "--priority", "-1", "--", "true"],
    [*SUBMIT, "--gpus", "two", "--", "true"],
    [*SUBMIT, "--max-runtime", "soon", "--", "true"],
    [*SUBMIT, "-eA=1", "--", "true"],
    [*SUBMIT, "--json", "--", "true"],
    [*SUBMIT, "--help"],
    [*SUBMIT],
    ["submit", "--share", "s", "--gpus", "2", "--", "true"],
    ["--js", *SUBMIT, "--", "true"],
    ["jobs"],
    ["--version"],
]


@pytest.mark.parametrize("argv", PLAIN, ids=[" ".join(a)[:50] for a in PLAIN])
def test_the_quick_parser_gives_argparses_answer(argv):
    from gpuquota_client.cli import build_parser, quick_submit_args

    quick = quick_submit_args(argv)
    assert quick is not None
    assert vars(quick) == vars(build_parser(argv).parse_args(argv)) == vars(build_parser().parse_args(argv))


@pytest.mark.parametrize("argv", OTHER, ids=[" ".join(a)[:50] for a in OTHER])
def test_anything_else_is_left_to_argparse(argv):
    from gpuquota_client.cli import quick_submit_args

    assert quick_submit_args(argv) is None


def test_a_parser_built_for_one_command_parses_as_the_whole_one():
    from gpuquota_client.cli import build_parser

    for argv in (["jobs", "--mine"], ["--json", "status", "A12"], ["logs", "3", "-f"], ["wait", "4"]):
        assert vars(build_parser(argv).parse_args(argv)) == vars(build_parser().parse_args(argv))


VALUES = [
    {"share": "s", "gpus": 2, "command": ["python", 'x\u00e9\u2028"\\\n'], "env": {}, "priority": 0},
    [1, -2, None, True, False, {"a": []}, "", 10**30],
    {"f": 1.5, "nan": float("nan")},
    {1: "int key"},
]
DOCS = [
    b'{"a": 1}',
    b' \n{"a": [1, 2.5, -0, 1e400, "x\\u00e9", null, true, false]}  ',
    b"\xef\xbb\xbf{}",
    b'{"a": NaN}',
    b'{"a": 1} x',
    b"",
    b"[1,]",
    b'"\\ud800"',
    '{"\u00e9": "\u00fc"}'.encode(),
    b'{"a": "b\tc"}',
    "{}".encode("utf-16"),
]


def test_quickjson_is_json():
    from gpuquota_client import quickjson

    for value in VALUES:
        assert quickjson.dumps(value) == json.dumps(value)
    for doc in DOCS:
        try:
            want = ("ok", json.loads(doc))
        except ValueError as e:
            want = ("error", type(e), str(e))
        try:
            got = ("ok", quickjson.loads(doc))
        except ValueError as e:
            got = ("error", type(e), str(e))
        assert repr(got) == repr(want), doc
