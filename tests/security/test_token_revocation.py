"""Issue 30, low items on tokens: a revoked token still submitted for API_TOKEN_CACHE_S in the web
server's other processes (the quick submit path's in-process token cache), and a non-UTF-8 byte in a
token was a 500. Now a revocation (logout, a token deleted, a password change, a user deactivated) stops
a token at once in every process, and a token that is not printable ASCII is a 401."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from knox.models import AuthToken
from rest_framework.test import APIClient

from jobs.models import Job

ROOT = Path(__file__).resolve().parents[2]
V1 = "/api/v1"


def body(**overrides):
    return {"share": "vision-main", "gpus": 1, "gpu_type": "a10g", "command": ["true"], **overrides}


@pytest.mark.parametrize(
    "raw", [b"Token \xff\xfe" + b"a" * 38, b"Token abc\x00def", "Token caf\u00e9".encode()]
)
@pytest.mark.parametrize("method", ["get", "post"])
def test_a_token_that_is_not_printable_ascii_is_a_401(vision_share, nodes, raw, method):
    client = APIClient()
    header = raw.decode("latin-1")  # as a WSGI server hands a header to Django
    r = getattr(client, method)(
        f"{V1}/jobs/", body() if method == "post" else None, format="json", HTTP_AUTHORIZATION=header
    )
    assert r.status_code == 401
    assert not Job.objects.exists()


def test_a_revoked_token_stops_at_once_in_every_process(as_bob, bob, vision_share, nodes, settings, taken):
    """Another process of the web server revokes it (here: the revocation generation moves in the shared
    cache, and the token row goes without this process hearing of it)."""
    from config import auth

    settings.API_TOKEN_CACHE_S = 3600
    assert as_bob.post(f"{V1}/jobs/", body(), format="json").status_code == 201
    assert auth._TOKENS  # cached here
    tokens = AuthToken.objects.filter(user=bob)
    tokens._raw_delete(tokens.db)  # no signal in this process
    auth.bump_revocations()  # what the other process's delete did
    assert as_bob.post(f"{V1}/jobs/", body(), format="json").status_code == 401
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_logout_in_another_process_stops_the_token_here(
    bob, vision_share, nodes, settings, no_messages, tmp_path
):
    """A real second process: `DELETE /auth/token/current/` is what it does (knox tokens deleted through
    the ORM, so its signals bump the generation in the cache they share: the file cache under var/)."""
    settings.API_TOKEN_CACHE_S = 3600
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path),
        }
    }
    _, key = AuthToken.objects.create(user=bob)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.post(f"{V1}/jobs/", body(), format="json").status_code == 201
    assert client.post(f"{V1}/jobs/", body(), format="json").status_code == 201  # from this process's cache
    code = (
        "from django.conf import settings; "
        f"settings.CACHES = {{'default': {{'BACKEND': 'django.core.cache.backends.filebased.FileBasedCache', "
        f"'LOCATION': {str(tmp_path)!r}}}}}; "
        "import django; django.setup(); "
        "from knox.models import AuthToken; AuthToken.objects.filter(user__username='bob').delete()"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": _database_url()}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not AuthToken.objects.filter(user=bob).exists()
    assert client.post(f"{V1}/jobs/", body(), format="json").status_code == 401
    assert Job.objects.count() == 2


def _database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
