"""CLI tests run the real `gpuquota` command (its main(), and once as a process) against a live test
server. The client package is used from client/src, as `pip install ./client` would install it."""

import io
import sys
from pathlib import Path

import pytest

CLIENT_SRC = Path(__file__).resolve().parents[2] / "client" / "src"
if str(CLIENT_SRC) not in sys.path:
    sys.path.insert(0, str(CLIENT_SRC))


@pytest.fixture(autouse=True)
def _quiet(no_messages):
    return no_messages


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "cfg" / "gpuquota" / "config.json"
    monkeypatch.setenv("GPUQUOTA_CONFIG", str(path))
    monkeypatch.delenv("GPUQUOTA_URL", raising=False)
    monkeypatch.delenv("GPUQUOTA_TOKEN", raising=False)
    return path


@pytest.fixture(autouse=True)
def _short_forecast_wait(monkeypatch):
    """No pass runs in these tests (no_messages): a submit or priority change that waits for the stored
    forecast to see it gives up soon. Tests whose passes run wait the CLI's own time
    (test_cli_forecast_after_change)."""
    monkeypatch.setattr("gpuquota_client.cli.FORECAST_WAIT_S", 0.3)


@pytest.fixture
def cli(capsys, monkeypatch):
    """The CLI in this process: cli(*argv, stdin="") -> (exit code, stdout, stderr)."""
    from gpuquota_client.cli import main

    def call(*argv, stdin=""):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


@pytest.fixture
def logged_in(cli, live_server, bob, vision_share, nodes, config_file):
    """The CLI, logged in as bob (a member of vision) against the live server."""
    code, out, err = cli(
        "login", live_server.url, "--username", "bob", "--password-stdin", stdin="bob-pw-123\n"
    )
    assert code == 0, err
    return cli


def cli_submit(argv):
    """`gpuquota submit ARGV` through the CLI's own parser and cmd_submit, against a client that records
    the body it would send: (exit code, body sent)."""
    from gpuquota_client.cli import cmd_submit, quick_submit_args

    args = quick_submit_args(argv)
    sent = {}

    class Client:
        def submit(self, **body):
            sent.update(body)
            return {"id": 1, "state": "QUEUED", "name": "", "share": "s", "gpus": 1, "gpu_type": "a10g"}

    args.client = Client
    args.settings = dict
    args.json = True
    return cmd_submit(args, lambda _: None), sent
