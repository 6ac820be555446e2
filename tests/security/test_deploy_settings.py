"""Production settings: `manage.py check --deploy` passes with DJANGO_ENV=production (secure cookies,
HSTS, SSL redirect, no DEBUG), and secrets come only from the environment."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def manage(tmp_path, *args, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "ALLOWED_HOSTS")}
    base.update({"GPUQUOTA_VAR_DIR": str(tmp_path), "DJANGO_ENV": "production", **env})
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=base, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_passes_in_production(tmp_path):
    r = manage(
        tmp_path,
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="gpuquota.example.com",
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    r = manage(tmp_path, "check", ALLOWED_HOSTS="gpuquota.example.com")
    assert r.returncode != 0 and "SECRET_KEY must come from the environment" in r.stderr
    assert not (tmp_path / "secret_key").exists()  # not generated into var/ in production


def test_production_refuses_debug(tmp_path):
    r = manage(tmp_path, "check", SECRET_KEY=secrets.token_urlsafe(50), DEBUG="true")
    assert r.returncode != 0 and "DEBUG must be off" in r.stderr


def test_production_settings_are_secure(tmp_path):
    code = (
        "from django.conf import settings as s; "
        "print(s.DEBUG, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, "
        "s.SECURE_HSTS_SECONDS > 0, s.SESSION_COOKIE_HTTPONLY)"
    )
    r = manage(tmp_path, "shell", "-c", code, SECRET_KEY=secrets.token_urlsafe(50))
    assert r.stdout.strip().splitlines()[-1].split() == ["False", "True", "True", "True", "True", "True"], (
        r.stdout + r.stderr
    )
