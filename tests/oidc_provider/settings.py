"""A real OpenID Connect provider for the tests: django-oauth-toolkit with OIDC on, in its own process
(tests/oidc_provider/serve.py). Everything it needs comes from PROVIDER_DIR: its database, its RS256 key
(made by the test) and knobs.json (its users with their groups, and what the tests make it do wrong)."""

import os
from pathlib import Path

DIR = Path(os.environ["PROVIDER_DIR"])
SECRET_KEY = "test-provider-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.oidc_provider.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [Path(__file__).parent / "templates"],
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(DIR / "provider.sqlite3")}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
LOGIN_URL = "/accounts/login/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The relying party and the provider both live on 127.0.0.1 (other ports): cookies do not tell ports
# apart, so each keeps its session under a name of its own.
SESSION_COOKIE_NAME = "provider_session"
CSRF_COOKIE_NAME = "provider_csrf"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": (DIR / "key.pem").read_text(),
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.validator.Validator",
    "SCOPES": {"openid": "OpenID Connect", "email": "e-mail", "profile": "profile"},
    "PKCE_REQUIRED": True,
    "ID_TOKEN_EXPIRE_SECONDS": 300,
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},  # provider.log, beside knobs.json
    "root": {"handlers": ["console"], "level": "WARNING"},
}
