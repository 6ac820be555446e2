"""`gpuquota login URL --token-stdin`: a token made on the Tokens page (what a user who signs in with the
directory, and has no password, gives the CLI); checked before it is saved."""

import json

from knox.models import AuthToken


def test_a_token_from_the_web_page_logs_the_cli_in(cli, live_server, bob, vision_share, config_file):
    _, key = AuthToken.objects.create(user=bob)
    code, out, _ = cli("login", live_server.url, "--token-stdin", stdin=f"{key}\n")
    assert code == 0 and "as bob" in out
    assert json.loads(config_file.read_text())["token"] == key
    code, out, _ = cli("shares")
    assert code == 0 and "vision-main" in out


def test_a_bad_token_is_refused_and_not_saved(cli, live_server, bob, config_file):
    code, _, err = cli("login", live_server.url, "--token-stdin", stdin="not-a-token\n")
    assert code == 2 and "Invalid token" in err
    assert not config_file.exists()
