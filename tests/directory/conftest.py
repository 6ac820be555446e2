import pytest

from directory import provider as directory_provider
from tests.directory.provider import CLIENT_ID, CLIENT_SECRET, Provider


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory):
    """A real OpenID Connect provider (django-oauth-toolkit) in its own process, for the whole session."""
    running = Provider(
        tmp_path_factory.mktemp("oidc-provider"),
        ["http://testserver/oidc/callback/", "http://127.0.0.1/oidc/callback/"],
    )
    yield running
    running.stop()


@pytest.fixture
def directory(oidc_provider, settings):
    """gpuquota configured to sign in with the test provider; every fault cleared."""
    settings.OIDC_ISSUER = oidc_provider.issuer
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    directory_provider.forget()
    oidc_provider.fault()
    for user in oidc_provider.knobs["users"]:
        oidc_provider.set_groups(user, [])
    yield oidc_provider
    directory_provider.forget()
