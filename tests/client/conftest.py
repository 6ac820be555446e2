"""CLI tests run the real `gpuquota` command (its main(), and once as a process) against a live test
server. The client package is used from client/src, as `pip install ./client` would install it."""

import sys
from pathlib import Path

import pytest
from django.core.cache import cache

CLIENT_SRC = Path(__file__).resolve().parents[2] / "client" / "src"
if str(CLIENT_SRC) not in sys.path:
    sys.path.insert(0, str(CLIENT_SRC))


@pytest.fixture(autouse=True)
def no_messages(monkeypatch, settings):
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    # A fast hasher: the tests log in a lot, and PBKDF2 is slow on purpose.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()
    return sent


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "cfg" / "gpuquota" / "config.json"
    monkeypatch.setenv("GPUQUOTA_CONFIG", str(path))
    monkeypatch.delenv("GPUQUOTA_URL", raising=False)
    monkeypatch.delenv("GPUQUOTA_TOKEN", raising=False)
    return path
