"""The sign-in file of a local install: var/credentials.txt, 0600, printed by `manage.py credentials`."""

import stat
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return tmp_path


def run(command, **kwargs) -> str:
    out = StringIO()
    call_command(command, stdout=out, **kwargs)
    return out.getvalue()


def passwords(path) -> dict[str, str]:
    return {
        line.split()[0]: line.split()[1] for line in path.read_text().splitlines() if not line.startswith("#")
    }


def test_the_admin_and_demo_passwords_are_kept_in_a_private_file_and_work(db, var_dir):
    run("seed_demo")
    out = run("ensure_admin")
    path = var_dir / "credentials.txt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    kept = passwords(path)
    assert set(kept) == {"admin", "bob", "carol", "dave"}
    users = get_user_model().objects.in_bulk(list(kept), field_name="username")
    for username, password in kept.items():
        assert users[username].check_password(password), username
    assert kept["admin"] not in out  # not printed in the middle of the set-up: printed last, below


def test_a_second_run_says_where_the_credentials_are(db, var_dir):
    run("ensure_admin")
    assert str(var_dir / "credentials.txt") in run("ensure_admin")


def test_the_credentials_command_prints_every_user_admin_first_and_how_to_reset(db, var_dir):
    run("seed_demo")
    run("ensure_admin")
    kept = passwords(var_dir / "credentials.txt")
    out = run("credentials")
    lines = out.splitlines()
    assert "credentials.txt" in lines[0] and "0600" in lines[0]
    assert lines[1].split()[:2] == ["admin", kept["admin"]]
    assert {line.split()[0]: line.split()[1] for line in lines[1:-1]} == kept
    assert "changepassword" in lines[-1]


def test_a_changed_password_is_marked_as_changed(db, var_dir):
    run("ensure_admin")
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("a-new-one-123")
    admin.save()
    assert "(password changed since)" in run("credentials")


def test_without_the_file_it_says_how_to_set_a_password(db, var_dir):
    assert "changepassword" in run("credentials")
